package main

import (
	"encoding/json"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
)

// goldenRecorder writes each named exchange to `dir` as <name>.request.json and
// <name>.response.json, indented, so the Rust tests read exactly what Cluster API sends
// and what it accepted. Unnamed exchanges are not recorded.
func goldenRecorder(dir string) func(string, runtime.Object, runtime.Object) {
	return func(name string, request, response runtime.Object) {
		if name == "" {
			return
		}
		for suffix, object := range map[string]runtime.Object{"request": request, "response": response} {
			raw, err := json.MarshalIndent(object, "", "  ")
			if err != nil {
				fail(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name+"."+suffix+".json"), append(raw, '\n'), 0o644); err != nil {
				fail(err)
			}
		}
	}
}
