//! `DISTRIBUTE_PJRT_DEVICES` on a real plugin (the pinned CPU one unless `PJRT_PLUGIN` names
//! another): a capped plugin offers that many devices, a client of all of them has that many,
//! asking for more is refused with both counts and the cap, and a bad value is an error that
//! names the variable. The cap is read once per process, so this binary (no libtest harness)
//! runs each case in a child process of its own with the variable set.

use std::process::Command;

use distribute_pjrt::{Client, ClientOptions, DEVICES_ENV, Plugin};

mod common;

/// Set in a child: which case it runs.
const CASE_ENV: &str = "DISTRIBUTE_PJRT_DEVICE_CAP_CASE";

fn main() {
    match std::env::var(CASE_ENV).as_deref() {
        Ok("capped") => capped(),
        Ok("bad") => bad_value(),
        _ => {
            for (case, cap) in [("capped", "1"), ("capped", "3"), ("bad", "0"), ("bad", "x")] {
                let exe = std::env::current_exe().expect("this test's own path");
                let output = Command::new(exe)
                    .env(CASE_ENV, case)
                    .env(DEVICES_ENV, cap)
                    .output()
                    .expect("could not start this test as a child");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                assert!(
                    output.status.success(),
                    "case {case} with {DEVICES_ENV}={cap} failed:\n{text}"
                );
                print!("{text}");
            }
            println!("device_cap: 4 cases passed");
        }
    }
}

fn plugin() -> &'static Plugin {
    Plugin::discover().unwrap_or_else(|err| panic!("{err}"))
}

fn capped() {
    let cap: usize = std::env::var(DEVICES_ENV).unwrap().parse().unwrap();
    let plugin = plugin();
    let offer = plugin.offer().unwrap();
    let most = offer.most_devices().expect("a capped plugin has a most");
    assert!(most <= cap, "{offer:?}");
    if offer.is_cpu() {
        assert_eq!(most, cap, "the CPU plugin becomes one of {cap} devices");
    }
    let (client, devices) = Client::with_devices(plugin, &ClientOptions::default(), None).unwrap();
    assert_eq!(devices.len(), most);
    assert_eq!(client.devices().unwrap().len(), most);
    let text = common::one_more_device_is_refused(plugin, most);
    if offer.is_cpu() {
        assert!(
            text.contains(&format!("has {cap} ({DEVICES_ENV}={cap})")),
            "the cap is named as the reason: {text}"
        );
        let short = offer.check(cap + 1).unwrap_err().to_string();
        assert_eq!(
            short,
            format!(
                "needs {} devices, the cpu plugin has {cap} ({DEVICES_ENV}={cap})",
                cap + 1
            )
        );
    }
    println!("capped at {cap}: {text}");
}

fn bad_value() {
    let value = std::env::var(DEVICES_ENV).unwrap();
    let plugin = plugin();
    for _ in 0..2 {
        // Not remembered: asked again, refused again.
        let err = plugin.offer().unwrap_err().to_string();
        assert!(
            err.contains(&format!("{DEVICES_ENV}={value} is not a device count")),
            "{err}"
        );
    }
    let err = Client::with_devices(plugin, &ClientOptions::default(), Some(1))
        .unwrap_err()
        .to_string();
    assert!(err.contains(DEVICES_ENV), "{err}");
    println!("{DEVICES_ENV}={value}: {err}");
}
