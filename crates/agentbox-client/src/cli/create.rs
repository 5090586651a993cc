//! `create`: the sandbox of a scope, made from a SandboxTemplate (or an image), or the one
//! that exists already.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::get::print_sandboxes;
use super::{Fail, ScopeFlags};
use crate::client::Sandboxes;
use agentbox_api::crd::{SandboxSpec, Scope};

#[derive(Args)]
pub(super) struct CreateArgs {
    #[command(flatten)]
    scope: ScopeFlags,
    /// The SandboxTemplate (in the namespace) to make the sandbox from.
    #[arg(long, conflicts_with = "image", required_unless_present = "image")]
    template: Option<String>,
    /// The image to run, for a sandbox without a template.
    #[arg(long)]
    image: Option<String>,
    /// Wait until it is Ready — at most this many seconds.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "120")]
    wait: Option<u64>,
}

/// The spec `create` asks for: from the template, else from the image.
fn spec(a: &CreateArgs, scope: Scope) -> Result<SandboxSpec, Fail> {
    match (&a.template, &a.image) {
        (Some(t), _) => Ok(SandboxSpec::from_template(t, scope)),
        (None, Some(i)) => Ok(SandboxSpec::from_image(i, scope)),
        (None, None) => Err(Fail("give --template or --image".into())),
    }
}

/// `agentbox create`.
pub(super) async fn create(sbx: &Sandboxes, a: CreateArgs) -> Result<ExitCode, Fail> {
    let scope = a.scope.scope()?;
    let mut h = sbx.get_or_create(&scope, spec(&a, scope.clone())?).await?;
    if let Some(secs) = a.wait {
        h.wait_ready(Duration::from_secs(secs)).await?;
    }
    print_sandboxes(&[h.sandbox().clone()]);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_api::crd::ScopeKind;

    fn args(template: Option<&str>, image: Option<&str>) -> CreateArgs {
        CreateArgs {
            scope: ScopeFlags::default(),
            template: template.map(String::from),
            image: image.map(String::from),
            wait: None,
        }
    }

    fn global() -> Scope {
        Scope {
            kind: ScopeKind::Global,
            agent: None,
            user: None,
            session: None,
        }
    }

    #[test]
    fn a_template_gives_a_templated_spec_and_an_image_a_plain_one() {
        let s = spec(&args(Some("agent"), None), global()).unwrap();
        assert_eq!(s.template_ref.map(|r| r.name).as_deref(), Some("agent"));
        assert_eq!(s.pod.image, None, "the image is the template's");
        let s = spec(&args(None, Some("busybox")), global()).unwrap();
        assert_eq!(s.template_ref, None);
        assert_eq!(s.pod.image.as_deref(), Some("busybox"));
        assert!(spec(&args(None, None), global()).is_err());
    }
}
