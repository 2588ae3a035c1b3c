//! Two inboxes behind one doorbell: a core's urgent and bulk lanes.
//!
//! Each lane is a [`Mailbox`] with its own single-word sleep protocol; the consumer may
//! park only when *both* agree. [`try_sleep_both`] raises the first lane's SLEEPING
//! bit, then the second's; if the second has a message announced it lowers the first
//! again and reports "stay awake". A producer that finds either lane asleep rings the
//! shared doorbell, so a message pushed to either lane after its bit went up always
//! wakes the consumer (no lost wake-up; the loom model in `tests/loom_lanes.rs`
//! checks it, including a broken variant that only consults the first lane). A ring
//! from the short window in which the first lane was asleep is spurious and harmless.

use super::mailbox::Mailbox;

/// Consumer side: `true` when both lanes are empty and asleep (park now).
pub fn try_sleep_both<T>(first: &Mailbox<T>, second: &Mailbox<T>) -> bool {
    if !first.try_sleep() {
        return false;
    }
    if second.try_sleep() {
        return true;
    }
    first.awake();
    false
}

/// Consumer side: woke up (doorbell or spuriously); both lanes are awake.
pub fn awake_both<T>(first: &Mailbox<T>, second: &Mailbox<T>) {
    first.awake();
    second.awake();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn sleeps_only_when_both_lanes_are_empty() {
        let (a, b) = (Mailbox::new(4), Mailbox::new(4));
        b.push(1).unwrap();
        assert!(!try_sleep_both(&a, &b));
        assert_eq!(a.push(2), Ok(false), "first lane was backed out of sleep");
        assert!(!try_sleep_both(&a, &b));
        assert_eq!((a.pop(), b.pop()), (Some(2), Some(1)));
        assert!(try_sleep_both(&a, &b));
        assert_eq!(
            b.push(3),
            Ok(true),
            "asleep: the second lane's producer rings"
        );
        awake_both(&a, &b);
        assert_eq!(a.push(4), Ok(false));
    }
}
