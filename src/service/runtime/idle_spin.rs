//! How an idle core waits for work: it spins, polling its rings, for up to
//! `spin_before_park_us`, then parks in the kernel until a completion or a doorbell
//! wakes it (`0`: it parks at once).
//!
//! The spin adapts to the idle times the core sees (glommio's executor loop,
//! `glommio::next_spin`, a kvroute patch: `vendor/glommio/KVROUTE_PATCH.md`). An idle
//! time the full spin would have covered doubles the next spin, up to the setting; a
//! longer one halves it, to nothing. A core serving many connections finds work
//! within the spin and keeps spinning, which spares it the park and the wake-up; a
//! core serving one request at a time waits longer than any spin each time, so it
//! soon parks at once. Spinning then only burned CPU and held back the threads the
//! core had just woken on its CPU (the worker it wrote the request to, the client it
//! wrote the answer to), which waited for the spin to end.
//!
//! Guarantees: the spin never exceeds the setting; a setting of `0` never spins.

use glommio::LocalExecutorBuilder;
use std::time::Duration;

/// Builder `b` with the idle spin of `spin_before_park_us` (the bound of the
/// adaptive spin; `0`: none).
pub fn configure(b: LocalExecutorBuilder, spin_before_park_us: u64) -> LocalExecutorBuilder {
    if spin_before_park_us == 0 {
        return b;
    }
    b.spin_before_park(Duration::from_micros(spin_before_park_us))
}

#[cfg(test)]
mod tests {
    use glommio::next_spin;
    use std::time::Duration;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Short idle times take the spin from nothing up to its bound and no further;
    /// long ones halve it down to nothing, where it stays while they last.
    #[test]
    fn the_spin_follows_the_idle_times() {
        let max = us(50);
        let mut spin = Duration::ZERO;
        let mut seen = vec![];
        for _ in 0..8 {
            spin = next_spin(spin, max, us(10));
            seen.push(spin.as_micros());
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 50, 50]);
        let mut seen = vec![];
        for _ in 0..8 {
            spin = next_spin(spin, max, us(500));
            seen.push(spin.as_nanos());
        }
        assert_eq!(seen, [25_000, 12_500, 6_250, 3_125, 1_562, 0, 0, 0]);
        // Back up as soon as the idle times are short again.
        assert_eq!(next_spin(spin, max, us(3)), us(1));
    }

    /// An idle time of exactly the bound was not covered by a spin of the bound; with
    /// no bound there is no spin, whatever the idle times.
    #[test]
    fn the_bound_is_the_limit() {
        let max = us(50);
        assert_eq!(next_spin(max, max, max), us(25));
        assert_eq!(next_spin(max, max, max - us(1)), max);
        for idle in [0, 1, 1_000] {
            assert_eq!(
                next_spin(Duration::ZERO, Duration::ZERO, us(idle)),
                Duration::ZERO
            );
        }
    }
}
