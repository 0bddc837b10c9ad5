//! A least-recently-used map bounded by the summed cost of its values.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Values shared as `Arc`s, each with a cost (its bytes, or 1 to bound a count).
///
/// Invariant: after every `insert`, the summed cost is at most `bound`, unless one
/// value alone costs more (it is then the only one held until the next insert).
pub struct Lru<K, V> {
    bound: usize,
    cost: usize,
    tick: u64,
    items: HashMap<K, (Arc<V>, u64, usize)>,
    /// Key of each item by its last use, oldest first.
    by_use: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub fn new(bound: usize) -> Self {
        Self {
            bound,
            cost: 0,
            tick: 0,
            items: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// The value of `key`, marked as the most recently used.
    pub fn get(&mut self, key: &K) -> Option<Arc<V>> {
        let (value, used, _) = self.items.get_mut(key)?;
        self.by_use.remove(used);
        self.tick += 1;
        *used = self.tick;
        self.by_use.insert(self.tick, key.clone());
        Some(value.clone())
    }

    pub fn contains(&self, key: &K) -> bool {
        self.items.contains_key(key)
    }

    /// Holds `value` under `key` (replacing what it held), then drops the least
    /// recently used values until the bound holds again.
    pub fn insert(&mut self, key: K, value: Arc<V>, cost: usize) {
        if let Some((_, used, old)) = self.items.remove(&key) {
            self.by_use.remove(&used);
            self.cost -= old;
        }
        self.tick += 1;
        self.by_use.insert(self.tick, key.clone());
        self.items.insert(key, (value, self.tick, cost));
        self.cost += cost;
        while self.cost > self.bound && self.items.len() > 1 {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, _, c)) = self.items.remove(&oldest) {
                self.cost -= c;
            }
        }
    }

    /// The summed cost of the values held.
    #[cfg(test)]
    pub fn cost(&self) -> usize {
        self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_the_bound_holds() {
        let mut lru = Lru::new(10);
        lru.insert("a", Arc::new(1), 4);
        lru.insert("b", Arc::new(2), 4);
        assert_eq!(lru.get(&"a").as_deref(), Some(&1));
        lru.insert("c", Arc::new(3), 4);
        assert!(!lru.contains(&"b"), "b was the least recently used");
        assert!(lru.contains(&"a") && lru.contains(&"c"));
        assert_eq!(lru.cost(), 8);
        lru.insert("a", Arc::new(4), 2);
        assert_eq!(lru.cost(), 6);
        assert_eq!(lru.get(&"a").as_deref(), Some(&4));
    }

    #[test]
    fn one_value_over_the_bound_is_held_alone() {
        let mut lru = Lru::new(10);
        lru.insert(1, Arc::new(()), 3);
        lru.insert(2, Arc::new(()), 30);
        assert!(!lru.contains(&1) && lru.contains(&2));
        assert_eq!(lru.cost(), 30);
        lru.insert(3, Arc::new(()), 1);
        assert!(!lru.contains(&2) && lru.contains(&3));
        assert_eq!(lru.cost(), 1);
    }
}
