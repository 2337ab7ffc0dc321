//! A client-side token bucket in front of every API request: kruise-daemon's QPS and burst
//! (client-go's `flowcontrol.NewTokenBucketRateLimiter`).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

// === impl TokenBucket ===

/// A token bucket shared by clones of the service: `burst` tokens, refilled at `qps`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    capacity: f64,
    rate: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token if one is there; else says how long until one is.
    fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Layer adding a client-side rate limit.
#[derive(Clone, Debug)]
pub struct TokenBucketLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl TokenBucketLayer {
    /// `qps` sustained, `burst` at once (both at least 1).
    pub fn new(qps: f64, burst: u32) -> Self {
        let capacity = f64::from(burst.max(1));
        TokenBucketLayer {
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: capacity,
                capacity,
                rate: qps.max(0.001),
                last: Instant::now(),
            })),
        }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucket<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucket {
            inner,
            bucket: self.bucket.clone(),
            has_token: false,
            sleep: None,
        }
    }
}

/// A service that waits for a token before each request.
pub struct TokenBucket<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
    has_token: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for TokenBucket<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_take(Instant::now());
            match taken {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_the_sustained_rate() {
        let start = Instant::now();
        let mut b = Bucket {
            tokens: 3.0,
            capacity: 3.0,
            rate: 10.0,
            last: start,
        };
        for _ in 0..3 {
            assert_eq!(b.try_take(start), Ok(()));
        }
        let wait = b.try_take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.try_take(start + Duration::from_millis(100)), Ok(()));
        // a long idle refills to the burst, not beyond
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        use tower::ServiceExt;
        let layer = TokenBucketLayer::new(2.0, 2);
        let svc = layer.layer(tower::service_fn(|_: ()| async {
            Ok::<_, ()>(Instant::now())
        }));
        let start = Instant::now();
        let mut svc = svc;
        let mut times = Vec::new();
        for _ in 0..4 {
            let t = svc.ready().await.unwrap().call(()).await.unwrap();
            times.push(t.duration_since(start));
        }
        assert_eq!(times[0], Duration::ZERO);
        assert_eq!(times[1], Duration::ZERO);
        assert_eq!(times[2], Duration::from_millis(500));
        assert_eq!(times[3], Duration::from_millis(1000));
    }
}
