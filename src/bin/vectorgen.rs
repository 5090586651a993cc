//! Prints the protocol test vectors as JSON; `tests/vectors/protocol.json` is this output.
#![forbid(unsafe_code)]

fn main() {
    print!("{}", agentbox::vectors::render_json());
}
