//! Keys that identify collective groups and instances (TF's `CollectiveKeys`, COL-41), and the
//! device-list helpers that form groups (`group_device_names`, COL-37; `extract_ranges`, COL-38).
//!
//! Every participant of a collective must use the same group key and instance key for the same
//! call; keys are handed out in call order, so processes that make the same calls agree without
//! talking.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::CollectiveError;

/// The first instance key of every device in a new group (TF's `INSTANCE_KEY_START_NUMBER`).
pub const INSTANCE_KEY_START: u64 = 100;

/// Hands out group keys per device list and instance keys per (group, device); thread-safe.
///
/// ```
/// use distribute_collectives::CollectiveKeys;
///
/// let keys = CollectiveKeys::new();
/// let group = keys.group_key(&["/gpu:0", "/gpu:1"]);
/// assert_eq!(group, 1);
/// assert_eq!(keys.instance_key(group, "/gpu:0")?, 100);
/// assert_eq!(keys.instance_key(group, "/gpu:0")?, 101);
/// assert_eq!(keys.instance_key(group, "/gpu:1")?, 100, "each device counts on its own");
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Debug)]
pub struct CollectiveKeys {
    state: Mutex<KeyState>,
}

#[derive(Debug)]
struct KeyState {
    next_group_key: u64,
    /// Group key of each device list; the order of the list matters. Keyed by the list itself
    /// rather than TF's `,`-joined string, so `["a,b"]` and `["a", "b"]` stay apart.
    known_groups: HashMap<Vec<String>, u64>,
    /// The next instance key of each device of each group.
    instance_keys: HashMap<u64, HashMap<String, u64>>,
}

impl Default for CollectiveKeys {
    fn default() -> Self {
        CollectiveKeys::new()
    }
}

impl CollectiveKeys {
    /// Keys whose first group key is 1.
    pub fn new() -> CollectiveKeys {
        CollectiveKeys::with_group_key_start(1)
    }

    /// Keys whose first group key is `group_key_start` (to keep apart from another set's).
    pub fn with_group_key_start(group_key_start: u64) -> CollectiveKeys {
        CollectiveKeys {
            state: Mutex::new(KeyState {
                next_group_key: group_key_start,
                known_groups: HashMap::new(),
                instance_keys: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeyState> {
        // The state is updated by single assignments, so a panic elsewhere cannot leave it
        // half-written: recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group key of `devices`: the same list always gets the same key, a new list the next
    /// unused one.
    pub fn group_key<S: AsRef<str>>(&self, devices: &[S]) -> u64 {
        let name: Vec<String> = devices.iter().map(|d| d.as_ref().to_owned()).collect();
        let mut state = self.lock();
        if let Some(&key) = state.known_groups.get(&name) {
            return key;
        }
        let key = state.next_group_key;
        state.next_group_key += 1;
        state.known_groups.insert(name, key);
        let per_device = devices
            .iter()
            .map(|d| (d.as_ref().to_owned(), INSTANCE_KEY_START))
            .collect();
        state.instance_keys.insert(key, per_device);
        key
    }

    /// The next instance key of `device` in group `group_key`, counting up from
    /// [`INSTANCE_KEY_START`] for each device independently.
    ///
    /// Fails for a group key never handed out, or a device that is not in the group.
    pub fn instance_key(&self, group_key: u64, device: &str) -> Result<u64, CollectiveError> {
        let mut state = self.lock();
        let group = state.instance_keys.get_mut(&group_key).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!(
                "group {group_key} is not found; get a group key from group_key() first"
            ))
        })?;
        let next = group.get_mut(device).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!(
                "device '{device}' is not present in group {group_key}"
            ))
        })?;
        let key = *next;
        *next += 1;
        Ok(key)
    }
}

/// Deals `devices` into groups of `group_size`, round-robin, wrapping around to fill the last
/// group: [d0, d1, d2] in groups of 2 → [[d0, d2], [d1, d0]] (TF's `group_device_names`).
///
/// Fails when `group_size` is 0 or larger than the number of devices.
pub fn group_device_names<S: Clone>(
    devices: &[S],
    group_size: usize,
) -> Result<Vec<Vec<S>>, CollectiveError> {
    let n = devices.len();
    if group_size == 0 || group_size > n {
        return Err(CollectiveError::InvalidArgument(format!(
            "only {n} devices, but group_size={group_size}; it must be between 1 and the device \
             count"
        )));
    }
    let num_groups = n.div_ceil(group_size);
    let mut groups = vec![Vec::with_capacity(group_size); num_groups];
    for i in 0..num_groups * group_size {
        groups[i % num_groups].push(devices[i % n].clone());
    }
    Ok(groups)
}

/// Runs of consecutive indices, as inclusive `[first, last]` pairs, and the indices on their
/// own (TF's `extract_ranges`).
///
/// A run grows while the next index follows on and the run spans at most `range_size_limit`
/// (last − first ≤ limit before adding), so a run holds at most `limit + 2` indices.
pub fn extract_ranges(
    index_list: &[usize],
    range_size_limit: usize,
) -> (Vec<[usize; 2]>, Vec<usize>) {
    let mut ranges = Vec::new();
    let mut singles = Vec::new();
    let Some((&start, rest)) = index_list.split_first() else {
        return (ranges, singles);
    };
    let (mut first, mut last) = (start, start);
    let mut close = |first: usize, last: usize| {
        if last > first {
            ranges.push([first, last]);
        } else {
            singles.push(first);
        }
    };
    for &i in rest {
        if i == last + 1 && last - first <= range_size_limit {
            last = i;
        } else {
            close(first, last);
            (first, last) = (i, i);
        }
    }
    close(first, last);
    (ranges, singles)
}

/// TF's default `range_size_limit` for [`extract_ranges`].
pub const DEFAULT_RANGE_SIZE_LIMIT: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_consistent_across_threads() {
        let keys = std::sync::Arc::new(CollectiveKeys::new());
        let group = keys.group_key(&["a", "b"]);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let keys = keys.clone();
                std::thread::spawn(move || {
                    (0..25)
                        .map(|_| keys.instance_key(group, "a").unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (100..200).collect::<Vec<_>>(),
            "no key handed out twice"
        );
    }
}
