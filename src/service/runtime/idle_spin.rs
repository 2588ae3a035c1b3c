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
//! The rings polled include the main ring's completions that wait in the kernel for
//! the core (a kvroute patch too: the main ring runs its completions cooperatively, so
//! a socket that becomes ready on another CPU does not interrupt the core); the spin
//! enters the kernel for them as soon as the ring flags them.
//!
//! Guarantees: the spin never exceeds the setting; a setting of `0` never spins; a
//! spinning core sees a completion as soon as the kernel has it, not when its spin
//! ends.

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
    use super::configure;
    use futures_lite::AsyncReadExt;
    use glommio::{next_spin, LocalExecutorBuilder, Placement};
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

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

    /// A core spinning with nothing to submit sees a socket become readable while it
    /// spins, long before the spin (30 s here) ends: the completion, found on another
    /// thread's write, waits in the kernel for the core, and is run there when the
    /// spin sees the ring's flag (or, at the latest, at the CPU's next tick).
    #[test]
    fn a_spinning_core_sees_a_completion_waiting_in_the_kernel() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(b"x").unwrap();
            // Open until the core has read it (then it closes its end).
            let _ = s.read(&mut [0u8; 1]);
        });
        let spin = Duration::from_secs(30);
        let spin_us = u64::try_from(spin.as_micros()).unwrap();
        let b = configure(LocalExecutorBuilder::new(Placement::Unbound), spin_us);
        let waited = b.make().unwrap().run(async move {
            let mut s = glommio::net::TcpStream::connect(addr).await.unwrap();
            let t = Instant::now();
            let mut byte = [0u8; 1];
            s.read_exact(&mut byte).await.unwrap();
            t.elapsed()
        });
        peer.join().unwrap();
        assert!(
            waited < spin / 2,
            "read after {waited:?}: the spin did not see it"
        );
    }
}
