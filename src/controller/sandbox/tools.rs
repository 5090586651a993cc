//! The tools every step of a reconcile works with, and where its status and Events go.

use super::write::{Apis, Writer};
use crate::controller::context::Context;
use crate::controller::pod::PodConfig;
use agentbox_api::crd::Sandbox;

/// One reconcile's tools, what every step works with: the operator's [`Context`], the
/// namespace's API handles and the pod settings. Every step takes them beside the Sandbox it
/// works on, which travels on its own so that a helper that needs no sandbox gets none.
#[derive(Clone, Copy)]
pub(super) struct Tools<'a> {
    /// The operator's context.
    pub ctx: &'a Context,
    /// The namespace's API handles.
    pub apis: &'a Apis,
    /// How the operator builds pods.
    pub podcfg: &'a PodConfig<'a>,
}

impl<'a> Tools<'a> {
    /// The tools of one reconcile.
    pub fn new(ctx: &'a Context, apis: &'a Apis, podcfg: &'a PodConfig<'a>) -> Self {
        Self { ctx, apis, podcfg }
    }

    /// Where `sbx`'s status and Events go.
    pub fn writer(&self, sbx: &'a Sandbox) -> Writer<'a> {
        Writer {
            sbx,
            ctx: self.ctx,
            apis: self.apis,
        }
    }
}
