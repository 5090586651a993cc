//! Progress deadlines: a stream between the operator and a sandbox fails when no byte moves
//! for a while, however long its overall timeout.
//!
//! What runs in a sandbox is untrusted: its `tar` (or its `sh`) can stop mid-archive and keep
//! the exec open, and the operator would wait out the outer timeout (hours) while holding the
//! scope's guard. A deadline on progress ends such a stream in `stall` instead. Two shapes:
//! - [`Deadline`], for a stream the operator reads (the snapshot's `tar -c`): only the time
//!   spent *waiting for the sandbox* counts, so a slow consumer (an object store taking its
//!   time over a part) is never blamed on the sandbox;
//! - [`within`] with a [`Meter`], for an exec the operator writes into (the restore's `tar -x`):
//!   the exec stops reading its stdin when the pod stops reading, so the watchdog counts the
//!   bytes taken from a [`Metered`] reader and the output seen, and fires when neither moved.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// No byte moved for the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no byte moved for {} s ({bytes} bytes had moved)", .after.as_secs_f64())]
pub struct Stalled {
    /// Bytes that had moved before the stream stalled.
    pub bytes: u64,
    /// The deadline that passed.
    pub after: Duration,
}

/// A stream of byte chunks that yields `Err(Stalled)` (and then ends) when its source keeps
/// the reader waiting for `stall` with nothing.
pub struct Deadline<S> {
    inner: S,
    stall: Duration,
    bytes: u64,
    /// Armed while the reader waits; dropped when an item arrives.
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl<S> Deadline<S> {
    /// `inner` with a progress deadline of `stall`.
    pub fn new(inner: S, stall: Duration) -> Self {
        Deadline {
            inner,
            stall,
            bytes: 0,
            timer: None,
            done: false,
        }
    }
}

/// The bytes an item carries, for the count a [`Stalled`] reports.
pub trait ByteLen {
    /// Its length in bytes.
    fn byte_len(&self) -> usize;
}

impl ByteLen for bytes::Bytes {
    fn byte_len(&self) -> usize {
        self.len()
    }
}

impl<T: ByteLen, E> ByteLen for Result<T, E> {
    fn byte_len(&self) -> usize {
        self.as_ref().map(ByteLen::byte_len).unwrap_or(0)
    }
}

impl<S> Stream for Deadline<S>
where
    S: Stream + Unpin,
    S::Item: ByteLen,
{
    type Item = Result<S::Item, Stalled>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(item)) => {
                this.timer = None;
                this.bytes += item.byte_len() as u64;
                Poll::Ready(Some(Ok(item)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let stall = this.stall;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.done = true;
                        Poll::Ready(Some(Err(Stalled {
                            bytes: this.bytes,
                            after: stall,
                        })))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// Bytes moved, shared between the parts of one transfer and its watchdog.
#[derive(Clone, Debug, Default)]
pub struct Meter(Arc<AtomicU64>);

impl Meter {
    /// Counts `n` more bytes.
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes counted so far.
    pub fn bytes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A reader whose bytes read are counted on a [`Meter`].
pub struct Metered<R> {
    inner: R,
    meter: Meter,
}

impl<R> Metered<R> {
    /// `inner`, counted on `meter`.
    pub fn new(inner: R, meter: Meter) -> Self {
        Metered { inner, meter }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Metered<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            self.meter.add(buf.filled().len() - before);
        }
        r
    }
}

/// Runs `fut` until it ends, or fails with [`Stalled`] once `meter` has not moved for `stall`
/// (checked every quarter of it). Dropping `fut` then drops its exec connection.
pub async fn within<F: Future>(
    meter: &Meter,
    stall: Duration,
    fut: F,
) -> Result<F::Output, Stalled> {
    let watchdog = async {
        let tick = (stall / 4).max(Duration::from_millis(10));
        let (mut seen, mut since) = (meter.bytes(), Instant::now());
        loop {
            tokio::time::sleep(tick).await;
            let now = meter.bytes();
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= stall {
                return Stalled {
                    bytes: now,
                    after: stall,
                };
            }
        }
    };
    tokio::select! {
        out = fut => Ok(out),
        stalled = watchdog => Err(stalled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;

    const STALL: Duration = Duration::from_secs(60);

    /// A chunk of 10 bytes at each of the given seconds from the start, then nothing, forever.
    fn chunks_then_silence(at: &[u64]) -> impl Stream<Item = Bytes> + Unpin {
        let stream = futures::stream::iter(at.to_vec())
            .scan(0u64, |prev, s| {
                let wait = s - std::mem::replace(prev, s);
                async move {
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    Some(Bytes::from_static(b"0123456789"))
                }
            })
            .chain(futures::stream::pending());
        Box::pin(stream)
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_that_goes_quiet_fails_after_the_deadline_with_the_bytes_seen() {
        let start = Instant::now();
        let mut s = Deadline::new(chunks_then_silence(&[1, 30, 85]), STALL);
        for _ in 0..3 {
            assert!(matches!(s.next().await, Some(Ok(_))));
        }
        let end = s.next().await;
        assert_eq!(
            end,
            Some(Err(Stalled {
                bytes: 30,
                after: STALL
            }))
        );
        // Measured from the last chunk (at 85 s), not from the start.
        assert_eq!(start.elapsed().as_secs(), 85 + 60);
        assert!(s.next().await.is_none(), "ends after the error");
    }

    #[tokio::test(start_paused = true)]
    async fn gaps_under_the_deadline_pass_and_the_end_is_the_end() {
        let src = Box::pin(
            futures::stream::iter([50u64, 50, 50, 50]).then(|w| async move {
                tokio::time::sleep(Duration::from_secs(w)).await;
                Bytes::from_static(b"x")
            }),
        );
        let got: Vec<_> = Deadline::new(src, STALL).collect().await;
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(Result::is_ok));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_the_sources_fault() {
        // The source has every chunk ready at once; the reader takes 100 s per chunk.
        let src = futures::stream::iter([Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        let mut s = Deadline::new(src, STALL);
        while let Some(item) = s.next().await {
            assert!(item.is_ok());
            tokio::time::sleep(Duration::from_secs(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn within_fires_when_the_meter_stops_and_not_while_it_moves() {
        let meter = Meter::default();
        let m = meter.clone();
        let moving = async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(30)).await;
                m.add(1);
            }
            "done"
        };
        assert_eq!(within(&meter, STALL, moving).await, Ok("done"));

        let meter = Meter::default();
        let m = meter.clone();
        let start = Instant::now();
        let stops = async move {
            m.add(5);
            tokio::time::sleep(Duration::from_secs(20)).await;
            m.add(7);
            futures::future::pending::<()>().await
        };
        let r = within(&meter, STALL, stops).await;
        assert_eq!(
            r,
            Err(Stalled {
                bytes: 12,
                after: STALL
            })
        );
        let took = start.elapsed().as_secs();
        assert!((80..=100).contains(&took), "{took}");
    }

    #[tokio::test]
    async fn a_metered_reader_counts_what_is_read() {
        let meter = Meter::default();
        let mut r = Metered::new(&b"hello world"[..], meter.clone());
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, b"hello world");
        assert_eq!(meter.bytes(), 11);
    }
}
