// htpasswd prints one line of an htpasswd file (USER:bcrypt hash) for the Distribution
// registry's htpasswd authentication, which accepts bcrypt only: `htpasswd USER PASSWORD`.
package main

import (
	"fmt"
	"os"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: htpasswd USER PASSWORD")
		os.Exit(2)
	}
	// The lowest cost: test passwords only, checked on every request.
	hash, err := bcrypt.GenerateFromPassword([]byte(os.Args[2]), bcrypt.MinCost)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s\n", os.Args[1], hash)
}
