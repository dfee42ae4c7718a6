//! District-scoped devices (`capacity --scoped`): each district's devices share a user whose
//! `district` attribute names it, the scope set gives that user the district's households and
//! visits plus a small shared form type, and devices send no `schema_types` (as Formulus).
//!
//! What each device checks, beyond the page checks every pull gets:
//! - it never receives a live record of another district or of a type outside its scope
//!   (`foreign_district_record`, `record_outside_scope`): S1;
//! - after each complete sync whose snapshot head is V, it has received every record of its
//!   district acknowledged at a head at most V since the run began, its own included
//!   (`district_record_missed`): S3. Devices start from cursor 0, so a device that joins late
//!   must receive its district's history too;
//! - its first complete sync holds every shared record (`shared_record_missed`);
//! - nothing leaves anybody's set in this run, so any tombstone is unexpected
//!   (`unexpected_tombstone`).
//!
//! The district's acknowledged pushes are a ledger of (head, record keys) in the order they were
//! acknowledged; each device walks it once, so the check costs what the pulls cost.

use crate::api::{Api, ScopedRecord};
use crate::payload::RecordPool;
use crate::scenarios::scope::ScopedTypes;
use rand::Rng;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A seeded record's key: the device that pushed it and its sequence number.
pub fn record_key(device: u64, seq: u64) -> u64 {
    (device << 32) | (seq & 0xffff_ffff)
}

/// How the run names its records: `obs_cap_<run>_<device>_<seq>` for a device's pushes,
/// `obs_cap_<run>_f_<i>` for the shared records.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
    pub types: ScopedTypes,
    pub shared_records: u64,
}

/// What one received record is to a device of district `d`.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// A live household or visit of the device's district, by key.
    District(u64),
    /// Shared record `i`.
    Shared(u64),
    /// A tombstone (nothing leaves a set in this run).
    Tombstone,
    /// A live record the device must not hold: the violation's kind.
    Foreign(&'static str),
}

impl Names {
    pub fn new(run: &str, types: ScopedTypes, shared_records: u64) -> Names {
        Names { prefix: format!("obs_cap_{run}_"), types, shared_records }
    }

    pub fn device_record(&self, device: u64, seq: u64) -> String {
        format!("{}{device}_{seq}", self.prefix)
    }

    pub fn shared_record(&self, i: u64) -> String {
        format!("{}f_{i}", self.prefix)
    }

    pub fn classify(&self, r: &ScopedRecord, district: &str) -> Seen {
        if r.deleted {
            return Seen::Tombstone;
        }
        let rest = r.observation_id.strip_prefix(&self.prefix);
        if r.form_type == self.types.shared {
            return match rest.and_then(|x| x.strip_prefix("f_")).and_then(|i| i.parse::<u64>().ok()) {
                Some(i) if i < self.shared_records => Seen::Shared(i),
                _ => Seen::Foreign("record_outside_scope"),
            };
        }
        if r.form_type != self.types.household && r.form_type != self.types.visit {
            return Seen::Foreign("record_outside_scope");
        }
        if r.district() != Some(district) {
            return Seen::Foreign("foreign_district_record");
        }
        let key = rest.and_then(|x| x.split_once('_')).and_then(|(d, s)| {
            let (d, s) = (d.parse::<u64>().ok()?, s.parse::<u64>().ok()?);
            Some(record_key(d, s))
        });
        match key {
            Some(k) => Seen::District(k),
            // A record of the district's types and value that this run did not push.
            None => Seen::Foreign("record_outside_scope"),
        }
    }
}

/// The district's acknowledged pushes, in the order they were acknowledged.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: Vec<(i64, Vec<u64>)>,
}

impl Ledger {
    pub fn push(&mut self, head: i64, keys: Vec<u64>) {
        self.entries.push((head, keys));
    }
}

/// One district: its user, its record pools and its ledger.
pub struct District {
    pub name: String,
    pub api: Arc<Api>,
    /// Households, then visits, each with this district in `data.district`.
    pub pools: [Arc<RecordPool>; 2],
    pub ledger: Mutex<Ledger>,
}

impl District {
    pub fn pool(&self, rng: &mut impl Rng) -> &RecordPool {
        &self.pools[usize::from(rng.gen_bool(0.3))]
    }
}

/// What a device's complete sync missed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Missed {
    pub district: Vec<u64>,
    pub shared: Vec<u64>,
}

/// One device's view of what it has received and what it still owes the ledger.
#[derive(Debug)]
pub struct Check {
    /// District records received whose push the device has not yet walked past in the ledger.
    pending: HashSet<u64>,
    /// The next ledger entry to walk.
    next: usize,
    /// Until the first complete sync: which shared records have arrived.
    shared: Option<Vec<bool>>,
}

impl Check {
    pub fn new(shared_records: u64) -> Check {
        Check { pending: HashSet::new(), next: 0, shared: Some(vec![false; shared_records as usize]) }
    }

    /// Takes one received record in; a foreign one is the caller's violation.
    pub fn receive(&mut self, seen: &Seen) {
        match *seen {
            Seen::District(k) => {
                self.pending.insert(k);
            }
            Seen::Shared(i) => {
                if let Some(slot) = self.shared.as_mut().and_then(|s| s.get_mut(i as usize)) {
                    *slot = true;
                }
            }
            Seen::Tombstone | Seen::Foreign(_) => {}
        }
    }

    /// After a complete sync whose snapshot head is `head`: every ledger entry acknowledged at
    /// or below it, walked in order up to the first one above it, must have been received.
    pub fn after_sync(&mut self, head: i64, ledger: &Ledger) -> Missed {
        let mut missed = Missed::default();
        while let Some((at, keys)) = ledger.entries.get(self.next) {
            if *at > head {
                break;
            }
            for k in keys {
                if !self.pending.remove(k) {
                    missed.district.push(*k);
                }
            }
            self.next += 1;
        }
        if let Some(shared) = self.shared.take() {
            missed.shared = (0..shared.len() as u64).filter(|&i| !shared[i as usize]).collect();
        }
        // A device's first sync can receive its district's whole history: give that memory back
        // once it is matched, or 20,000 devices keep their largest sync's table each.
        if self.pending.capacity() > 256 && self.pending.len() * 4 < self.pending.capacity() {
            self.pending.shrink_to_fit();
        }
        missed
    }
}

/// Hands devices out to districts of random sizes in `min..=max`, in order: a district is
/// filled before the next one opens.
#[derive(Debug)]
pub struct Planner {
    min: u64,
    max: u64,
    /// Size of each district opened so far.
    sizes: Vec<u64>,
    /// Devices in the last one.
    filled: u64,
}

impl Planner {
    pub fn new(min: u64, max: u64) -> Planner {
        Planner { min: min.max(1), max: max.max(min.max(1)), sizes: Vec::new(), filled: 0 }
    }

    /// The district of the next device; a new district's index is `districts() - 1`.
    pub fn place(&mut self, rng: &mut impl Rng) -> u64 {
        if self.sizes.last().is_none_or(|&size| self.filled >= size) {
            self.sizes.push(rng.gen_range(self.min..=self.max));
            self.filled = 0;
        }
        self.filled += 1;
        self.sizes.len() as u64 - 1
    }

    pub fn districts(&self) -> u64 {
        self.sizes.len() as u64
    }

    /// The mean size of the districts opened so far, the last one counted as filled so far.
    pub fn mean_size(&self) -> f64 {
        let full: u64 = self.sizes.iter().rev().skip(1).sum();
        let devices = full + self.filled;
        devices as f64 / self.sizes.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DistrictField;
    use rand::SeedableRng;

    fn names() -> Names {
        Names::new("r1", ScopedTypes::new("cap_r1"), 3)
    }

    fn rec(id: &str, form_type: &str, district: Option<&str>, deleted: bool) -> ScopedRecord {
        ScopedRecord {
            observation_id: id.into(),
            version: 1,
            form_type: form_type.into(),
            deleted,
            data: Some(DistrictField { district: district.map(String::from) }),
        }
    }

    #[test]
    fn records_are_classified_by_type_district_and_id() {
        let n = names();
        let own = n.device_record(12, 7);
        assert_eq!(
            n.classify(&rec(&own, "cap_r1_household", Some("d0001"), false), "d0001"),
            Seen::District(record_key(12, 7))
        );
        assert_eq!(
            n.classify(&rec(&own, "cap_r1_visit", Some("d0001"), false), "d0001"),
            Seen::District(record_key(12, 7))
        );
        assert_eq!(
            n.classify(&rec(&own, "cap_r1_household", Some("d0002"), false), "d0001"),
            Seen::Foreign("foreign_district_record")
        );
        // A household without the field is not the district's either.
        assert_eq!(
            n.classify(&rec(&own, "cap_r1_household", None, false), "d0001"),
            Seen::Foreign("foreign_district_record")
        );
        assert_eq!(
            n.classify(&rec(&n.shared_record(2), "cap_r1_facility", None, false), "d0001"),
            Seen::Shared(2)
        );
        assert_eq!(
            n.classify(&rec(&n.shared_record(3), "cap_r1_facility", None, false), "d0001"),
            Seen::Foreign("record_outside_scope")
        );
        assert_eq!(
            n.classify(&rec("obs_other", "load_seed", None, false), "d0001"),
            Seen::Foreign("record_outside_scope")
        );
        assert_eq!(
            n.classify(&rec("obs_other_1_2", "cap_r1_household", Some("d0001"), false), "d0001"),
            Seen::Foreign("record_outside_scope")
        );
        // Tombstones carry `data: {}`: they are told apart before the district is looked at.
        let tomb = ScopedRecord {
            data: Some(DistrictField::default()),
            ..rec(&own, "cap_r1_household", None, true)
        };
        assert_eq!(n.classify(&tomb, "d0001"), Seen::Tombstone);
    }

    #[test]
    fn a_complete_sync_must_hold_every_push_acknowledged_at_or_below_its_head() {
        let mut ledger = Ledger::default();
        ledger.push(10, vec![1, 2]);
        ledger.push(30, vec![3]);
        ledger.push(20, vec![4]); // acknowledged after the one at 30
        let mut c = Check::new(2);
        for s in [Seen::District(1), Seen::District(2), Seen::Shared(0), Seen::Shared(1), Seen::District(4)] {
            c.receive(&s);
        }
        // Head 25: the entry at 30 stops the walk; 4 stays pending until then.
        assert_eq!(c.after_sync(25, &ledger), Missed::default());
        // Head 40 without 3: missed; 4 was received earlier and still counts.
        assert_eq!(c.after_sync(40, &ledger), Missed { district: vec![3], shared: vec![] });
        // Walked entries are not walked again.
        ledger.push(50, vec![5]);
        c.receive(&Seen::District(5));
        assert_eq!(c.after_sync(60, &ledger), Missed::default());
    }

    #[test]
    fn the_first_complete_sync_must_hold_every_shared_record() {
        let ledger = Ledger::default();
        let mut c = Check::new(3);
        c.receive(&Seen::Shared(1));
        assert_eq!(c.after_sync(5, &ledger), Missed { district: vec![], shared: vec![0, 2] });
        // Checked once: later syncs need not carry them again.
        assert_eq!(c.after_sync(6, &ledger), Missed::default());
    }

    #[test]
    fn districts_are_filled_in_order_with_sizes_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut p = Planner::new(5, 50);
        let mut per: Vec<u64> = Vec::new();
        for _ in 0..20_000 {
            let d = p.place(&mut rng) as usize;
            if d == per.len() {
                per.push(0);
            }
            assert_eq!(d, per.len() - 1, "a district is filled before the next opens");
            per[d] += 1;
        }
        assert_eq!(p.districts() as usize, per.len());
        for &n in &per[..per.len() - 1] {
            assert!((5..=50).contains(&n), "{n}");
        }
        let mean = p.mean_size();
        assert!((20.0..35.0).contains(&mean), "{mean}");
        assert!((20_000.0 / mean - per.len() as f64).abs() < 1.0);
    }
}
