//! The progress bar every front end draws while it trains.

use indicatif::{ProgressBar, ProgressStyle};

use crate::Config;

/// A bar of `config.steps` steps named by the replica count; hidden unless `config.progress`.
pub(crate) fn progress_bar(config: &Config) -> ProgressBar {
    if !config.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(config.steps as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} steps · {msg}",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_prefix(match config.devices.len() {
        1 => "1 replica".to_owned(),
        n => format!("{n} replicas"),
    });
    bar
}
