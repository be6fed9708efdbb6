//! Checks shared by the plugin's test binaries.

use distribute_pjrt::{Client, ClientOptions, PjrtError, Plugin};

/// Asks `plugin`, which offers `most` devices, for one more: the refusal must be
/// `NotEnoughDevices` naming both counts. Returns its text.
pub(crate) fn one_more_device_is_refused(plugin: &'static Plugin, most: usize) -> String {
    let err = Client::with_devices(plugin, &ClientOptions::default(), Some(most + 1)).unwrap_err();
    assert!(
        matches!(err, PjrtError::NotEnoughDevices { ref shortfall, .. }
            if shortfall.needed == most + 1 && shortfall.has == most),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("asked for {} devices", most + 1)),
        "{text}"
    );
    assert!(text.contains(&format!("has {most}")), "{text}");
    text
}
