//! The devices the TPU tests and the `tpu` bench run on: those the plugin offers
//! ([`Plugin::offer`]: the CPU plugin as many as asked, one GPU one, `DISTRIBUTE_PJRT_DEVICES`
//! caps either). A test generic over the replica count runs over the counts the plugin can give
//! ([`counts`], [`up_to`]); a test that needs more devices prints `skipped: needs N devices, the
//! <platform> plugin has M` ([`has`]) and returns before it creates a client.

// Each test binary uses some of these.
#![allow(dead_code)]

use distribute_pjrt::{Offer, Plugin, PluginOption};
use distribute_tpu::{TpuConfig, TpuStrategy};

/// What the plugin of these tests offers (`PJRT_PLUGIN`, else the pinned CPU plugin).
pub(crate) fn offer() -> &'static Offer {
    Plugin::discover()
        .and_then(Plugin::offer)
        .unwrap_or_else(|err| panic!("{err}"))
}

/// A strategy over the plugin's first `devices` devices (which it must have).
pub(crate) fn strategy(devices: usize) -> TpuStrategy {
    TpuStrategy::new(TpuConfig::cpu(devices)).unwrap_or_else(|err| panic!("{err}"))
}

/// `config` for a strategy created while another holds its own client. On a GPU plugin
/// (`cuda`, `rocm`) its client allocates GPU memory as it needs it (`preallocate = false`): the
/// other client took 75 % of the GPU's memory as it started.
pub(crate) fn sharing_the_devices(mut config: TpuConfig) -> TpuConfig {
    if matches!(offer().platform(), "cuda" | "rocm") {
        config
            .client
            .plugin_options
            .push(("preallocate".to_owned(), PluginOption::Bool(false)));
    }
    config
}

/// A strategy over the first `devices` devices while another strategy holds its own client
/// ([`sharing_the_devices`]).
pub(crate) fn another_strategy(devices: usize) -> TpuStrategy {
    TpuStrategy::new(sharing_the_devices(TpuConfig::cpu(devices)))
        .unwrap_or_else(|err| panic!("{err}"))
}

/// Prints why the running test (or bench) skips some of its work.
pub(crate) fn skip(reason: &dyn std::fmt::Display) {
    match std::thread::current().name() {
        Some(test) if test != "main" => println!("skipped: {reason} ({test})"),
        _ => println!("skipped: {reason}"),
    }
}

/// Whether the plugin has `devices` devices; if not, says so as the test's skip.
pub(crate) fn has(devices: usize) -> bool {
    match offer().check(devices) {
        Ok(()) => true,
        Err(short) => {
            skip(&short);
            false
        }
    }
}

/// The counts of `counts` the plugin can give; each of the others is skipped with its reason.
pub(crate) fn counts(counts: &[usize]) -> Vec<usize> {
    let (within, short) = offer().counts_within(counts);
    for shortfall in &short {
        skip(shortfall);
    }
    within
}

/// `devices`, or fewer when the plugin has fewer: for a test whose checks hold on any count.
pub(crate) fn up_to(devices: usize) -> usize {
    offer()
        .most_devices()
        .map_or(devices, |most| most.min(devices))
}
