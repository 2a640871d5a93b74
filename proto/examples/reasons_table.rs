//! Prints the condition reasons as the Markdown table kept in the troubleshooting guide.
//! `make docs` runs it.

fn main() {
    print!("{}", inplace_proto::reason::markdown_table());
}
