//! Notices for long waits on peers: a rank blocked in a collective or an agreement says on stderr
//! what it waits for after a tenth of the collective timeout (at most [`FIRST_NOTICE`], at least
//! a second) and then every six times that, until the wait ends or the timeout passes. With the
//! default 10-minute timeout: after 10 s, then every minute. A slow rank 0 (evaluation, a
//! checkpoint, a download) is then visible on every other rank within seconds instead of after
//! the timeout.

use std::time::{Duration, Instant};

use g4ft_wait::Schedule;

use crate::error::RankTag;

/// Longest silence before the first notice: shorter waits are ordinary (a bucket's tail, a
/// barrier while rank 0 saves).
pub const FIRST_NOTICE: Duration = Duration::from_secs(10);

/// The silence before a wait's first notice: a tenth of its `timeout`, at least a second and at
/// most [`FIRST_NOTICE`].
fn first_notice(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_secs(1), FIRST_NOTICE)
}

/// One collective wait's notice schedule. Blocking calls wait at most until [`WaitNotice::due`],
/// then call [`WaitNotice::tick`] and block again until their own deadline.
pub(crate) struct WaitNotice {
    tag: RankTag,
    schedule: Schedule,
    timeout: Duration,
}

impl WaitNotice {
    /// Starts the schedule of a wait that gives up after `timeout`.
    pub fn new(tag: RankTag, timeout: Duration) -> Self {
        let first = first_notice(timeout);
        WaitNotice {
            tag,
            schedule: Schedule::new(first, first * 6),
            timeout,
        }
    }

    /// When the next notice is due, or `deadline` if that comes first: the end of the next
    /// blocking slice.
    pub fn due(&self, deadline: Instant) -> Instant {
        self.schedule.next_due().min(deadline)
    }

    /// Prints `rank r/w: still waiting for <what>` when a notice is due; `what` is only built then.
    pub fn tick(&mut self, what: impl FnOnce() -> String) {
        if !self.schedule.due_now() {
            return;
        }
        eprintln!(
            "{}: still waiting for {} ({} s of the {} s collective timeout)",
            self.tag,
            what(),
            self.schedule.elapsed_s(),
            self.timeout.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_end_at_the_next_notice_or_the_deadline() {
        let tag = RankTag { rank: 1, world: 2 };
        let mut n = WaitNotice::new(tag, Duration::from_secs(600));
        let far = Instant::now() + Duration::from_secs(600);
        let near = Instant::now() + Duration::from_secs(1);
        assert!(n.due(far) > Instant::now() + FIRST_NOTICE - Duration::from_secs(1));
        assert_eq!(n.due(near), near);
        n.tick(|| unreachable!("no notice before the first is due"));
        n.schedule = Schedule::new(Duration::ZERO, Duration::from_secs(60));
        let mut built = false;
        n.tick(|| {
            built = true;
            "rank 0".into()
        });
        assert!(built);
        assert!(n.due(far) >= Instant::now() + Duration::from_secs(59));
        // short timeouts (tests) get their first notice sooner, never before a second
        assert_eq!(
            first_notice(Duration::from_secs(20)),
            Duration::from_secs(2)
        );
        assert_eq!(
            first_notice(Duration::from_millis(200)),
            Duration::from_secs(1)
        );
    }
}
