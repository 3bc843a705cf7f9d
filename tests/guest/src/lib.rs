//! Support for the end-to-end tests that need the project's Linux guest: finding the kernel
//! and root disk the project's commands built ([`artifacts`]), booting it under our VMM to its
//! agent on hardware KVM ([`kvm`]), in a bare VMM process ([`vmm`]) and through the microvm
//! backend ([`microvm`]), and under
//! QEMU's software emulation with our devices served over vhost-user ([`qemu`], with
//! [`vhost_relay`] between QEMU and our net server).
//!
//! These tests live in their own crate because they need a guest kernel that takes minutes to
//! build the first time: `scripts/test.sh` builds it in the background while the rest of the
//! suite runs, then runs this crate's tests. Without a built kernel they fail and name the
//! command that builds it; they never skip silently.

pub mod artifacts;
pub mod kvm;
pub mod microvm;
pub mod qemu;
pub mod vhost_relay;
pub mod vmm;
