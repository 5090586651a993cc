//! What every step of a reconcile has in hand, and where its status and Events go.

use super::write::{Apis, Writer};
use crate::controller::context::{Context, Note};
use crate::controller::pod::PodConfig;
use agentbox_api::crd::{Sandbox, SandboxStatus};

/// One reconcile's hands: the sandbox (its effective spec), the operator's context, the
/// namespace's API handles and the pod settings. Every step of [`super::act`] takes them.
#[derive(Clone, Copy)]
pub(super) struct Hands<'a> {
    /// The Sandbox, with its template applied.
    pub sbx: &'a Sandbox,
    /// The operator's context.
    pub ctx: &'a Context,
    /// The namespace's API handles.
    pub apis: &'a Apis,
    /// How the operator builds pods.
    pub podcfg: &'a PodConfig<'a>,
}

impl<'a> Hands<'a> {
    /// Where the status and Events go.
    pub fn writer(&self) -> Writer<'a> {
        Writer {
            sbx: self.sbx,
            ctx: self.ctx,
            apis: self.apis,
        }
    }
}

/// A status to write with the Event that says why.
pub(super) struct Transition {
    /// The status after the step.
    pub status: SandboxStatus,
    /// The Event that goes with it.
    pub note: Option<Note>,
}
