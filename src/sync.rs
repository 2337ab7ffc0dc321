//! Locks that outlive a panic. Every mutex of the daemon guards data that is consistent after
//! each statement, so a task that panicked while holding one left nothing half-done: the data
//! is taken from a poisoned lock rather than every later lock panicking too.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data from a poisoned lock (see the module docs).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let held = m.clone();
        let panicked = std::thread::spawn(move || {
            let mut v = lock(&held);
            v.push(2);
            panic!("while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), [1, 2]);
    }
}
