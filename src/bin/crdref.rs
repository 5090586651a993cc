//! Prints the API reference rendered from the CRDs; `docs/reference.md` is this output.
#![forbid(unsafe_code)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    print!("{}", agentbox_api::crd::reference::render_markdown()?);
    Ok(())
}
