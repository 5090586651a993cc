//! Prints the protocol test vectors as JSON; `tests/vectors/protocol.json` is this output.
#![forbid(unsafe_code)]

fn main() {
    print!("{}", agentbox_api::vectors::render_json());
}
