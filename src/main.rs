//! The `kvroute` binary: `kvroute serve` runs the router; `kvroute print-config` shows
//! the effective settings.
//!
//! Exit codes: 0 stopped cleanly; 1 stopped, but the shutdown snapshot (`state_dir`)
//! failed; 2 could not start (bad settings, unusable state dir, snapshot that cannot be
//! restored, port taken, io_uring refused or locked memory too low (`service::runtime::preflight`),
//! a core that did not start, ...).

#[cfg(all(target_os = "linux", feature = "service"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use kvroute::cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::PrintConfig(args) => match args.settings() {
            Ok(s) => match toml::to_string(&s) {
                Ok(t) => {
                    print!("{t}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e.to_string()),
            },
            Err(e) => fail(&e),
        },
        Command::Serve(args) => match args.settings() {
            Ok(s) => serve(s),
            Err(e) => fail(&e),
        },
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("kvroute: {msg}");
    ExitCode::from(2)
}

#[cfg(all(target_os = "linux", feature = "service"))]
fn serve(settings: kvroute::settings::Settings) -> ExitCode {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot install signal handlers: {e}")),
    };
    let running = match kvroute::service::start(settings) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    // The addresses actually bound (port 0 resolved).
    let s = &running.shared.settings;
    let (events, api, http) = (&s.events_addr, &s.api_addr, &s.http_addr);
    println!(
        "kvroute {} listening: events {events} (binary), api {api} (binary), http {http} (JSON, /metrics) on {} core(s)",
        env!("CARGO_PKG_VERSION"),
        running.shared.cores
    );
    if !kvroute::proxy::config::is_off(&s.proxy_addr) {
        println!("kvroute proxy listening: {} (OpenAI)", s.proxy_addr);
    }
    if s.epp.enabled() {
        println!(
            "kvroute endpoint picker listening: {} (ext_proc gRPC)",
            s.epp.addr
        );
    }
    // SIGHUP re-reads the engines file; SIGINT / SIGTERM stop.
    for sig in signals.forever() {
        if sig != SIGHUP {
            eprintln!("kvroute: signal {sig}, shutting down");
            break;
        }
        match running.reload_engines() {
            Ok(()) => eprintln!("kvroute: SIGHUP: reading the engines file"),
            Err(why) => eprintln!("kvroute: SIGHUP ignored: {why}"),
        }
    }
    let t0 = std::time::Instant::now();
    let (active, drain_ms) = (running.proxy_inflight(), s.proxy.drain_ms);
    if active > 0 && drain_ms > 0 {
        eprintln!(
            "kvroute: draining {active} proxied request(s), up to {drain_ms} ms (signal again to stop now)"
        );
    }
    // A second SIGINT / SIGTERM stops the drain (a SIGHUP does not).
    let left = running.drain(|| signals.pending().any(|s| s != SIGHUP));
    if left > 0 {
        eprintln!("kvroute: stopping with {left} proxied request(s) still running");
    } else if active > 0 {
        eprintln!("kvroute: drained in {} ms", t0.elapsed().as_millis());
    }
    match running.shutdown() {
        Ok(()) => {
            eprintln!("kvroute: stopped in {} ms", t0.elapsed().as_millis());
            ExitCode::SUCCESS
        }
        // Distinct from 2 (could not start): served, but the state was not saved.
        Err(e) => {
            eprintln!("kvroute: {e}");
            eprintln!("kvroute: stopped, state not saved");
            ExitCode::from(1)
        }
    }
}

#[cfg(not(all(target_os = "linux", feature = "service")))]
fn serve(_: kvroute::settings::Settings) -> ExitCode {
    fail("kvroute serve needs Linux (glommio / io_uring)")
}
