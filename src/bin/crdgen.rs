//! Prints the CRDs as YAML; `crds/agentbox.yaml` is this output.
#![forbid(unsafe_code)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    print!("{}", agentbox_api::crd::render_yaml()?);
    Ok(())
}
