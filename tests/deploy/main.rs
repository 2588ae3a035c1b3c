//! Deploying kvroute as a platform team does, through the real binary and the files in
//! `deploy/`: start-up checks and core pinning (`startup`), engines that come and go
//! (`engines`), and the manifests, seccomp profile and dashboard (`manifests`). One
//! test binary for the three, so CI links it once.

#[path = "../common/mod.rs"]
mod common;

mod engines;
mod manifests;
mod startup;
