//! Lists read a page at a time, each page reduced to what the caller keeps before the next is
//! read (issue 44). A LIST without a limit is one response holding every object whole: the
//! sweep's read of a namespace's Sandboxes (`sweep::in_use`, at start-up and every pass) took
//! 10,000 Suspended Sandboxes with their managed fields into memory at once, the largest part
//! of a restarted operator's peak (docs/operations.md, "Memory"). Pages of [`PAGE`] objects
//! bound that to one page, and the pages of one listing are one consistent snapshot (the API
//! server serves the continuation at the first page's resource version), as the single LIST was.

use std::fmt::Debug;
use std::future::Future;

use kube::api::{Api, ListParams, ObjectList};
use serde::de::DeserializeOwned;

/// Objects per page: kube-runtime's watchers list 500 at a time too.
pub const PAGE: u32 = 500;

/// The request for the page after one whose continuation is `token` (none or empty: that was
/// the last page).
pub fn next_page(lp: &ListParams, token: Option<&str>) -> Option<ListParams> {
    let token = token.filter(|t| !t.is_empty())?;
    Some(lp.clone().continue_token(token))
}

/// Feeds every object of the listing `fetch` serves (from `lp`, [`PAGE`] at a time) to `each`,
/// page by page: a page is dropped before the next is read.
pub async fn fold<K, F, Fut, E>(
    lp: &ListParams,
    mut fetch: F,
    mut each: impl FnMut(K),
) -> Result<(), E>
where
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<K>, E>>,
    K: Clone,
{
    let first = lp.clone().limit(PAGE);
    let mut request = Some(first.clone());
    while let Some(lp) = request.take() {
        let page = fetch(lp).await?;
        request = next_page(&first, page.metadata.continue_.as_deref());
        page.items.into_iter().for_each(&mut each);
    }
    Ok(())
}

/// [`fold`] over `api`'s objects.
pub async fn each<K>(api: &Api<K>, lp: &ListParams, each: impl FnMut(K)) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    fold(lp, |lp| async move { api.list(&lp).await }, each).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ListMeta;
    use std::sync::Mutex;

    fn page(items: &[u32], token: Option<&str>) -> ObjectList<u32> {
        ObjectList {
            types: Default::default(),
            metadata: ListMeta {
                continue_: token.map(str::to_string),
                ..ListMeta::default()
            },
            items: items.to_vec(),
        }
    }

    /// What one page's request asked: its limit, continuation and label selector.
    type Asked = (Option<u32>, Option<String>, Option<String>);

    #[tokio::test]
    async fn every_page_is_read_with_the_last_continuation_and_the_callers_selector() {
        let asked: Mutex<Vec<Asked>> = Mutex::default();
        let pages = [
            page(&[1, 2], Some("c1")),
            page(&[3, 4], Some("c2")),
            page(&[5], Some("")),
        ];
        let mut got = Vec::new();
        let lp = ListParams::default().labels("a=b");
        let out: Result<(), String> = fold(
            &lp,
            |lp| {
                let mut asked = asked.lock().unwrap();
                asked.push((
                    lp.limit,
                    lp.continue_token.clone(),
                    lp.label_selector.clone(),
                ));
                let p = pages[asked.len() - 1].clone();
                async move { Ok(p) }
            },
            |x| got.push(x),
        )
        .await;
        out.unwrap();
        assert_eq!(got, [1, 2, 3, 4, 5]);
        let asked = asked.into_inner().unwrap();
        let sel = Some("a=b".to_string());
        assert_eq!(
            asked,
            [
                (Some(PAGE), None, sel.clone()),
                (Some(PAGE), Some("c1".into()), sel.clone()),
                (Some(PAGE), Some("c2".into()), sel),
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_page_fails_the_listing() {
        let mut calls = 0;
        let out: Result<(), String> = fold(
            &ListParams::default(),
            |_| {
                calls += 1;
                let r = if calls == 1 {
                    Ok(page(&[1], Some("c1")))
                } else {
                    Err("410 Gone: the continuation expired".to_string())
                };
                async move { r }
            },
            |_| {},
        )
        .await;
        assert_eq!(out, Err("410 Gone: the continuation expired".to_string()));
    }

    #[test]
    fn no_continuation_is_the_last_page() {
        let lp = ListParams::default().limit(PAGE);
        assert!(next_page(&lp, None).is_none());
        assert!(next_page(&lp, Some("")).is_none());
        let next = next_page(&lp, Some("t")).unwrap();
        assert_eq!(next.continue_token.as_deref(), Some("t"));
        assert_eq!(next.limit, Some(PAGE));
    }
}
