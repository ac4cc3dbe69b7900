//! A memory source that replays a script: unit tests and the `auto`
//! benchmark use it to cross the threshold at a known moment.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::error::AutoError;
use super::source::{MemSample, MemorySource};

#[derive(Debug)]
struct Script {
    queue: VecDeque<MemSample>,
    last: MemSample,
    samples_taken: u64,
}

/// Returns queued samples one per call, then repeats the last one forever.
#[derive(Debug, Clone)]
pub struct ScriptedSource {
    script: Arc<Mutex<Script>>,
}

/// Lets another thread change what a [`ScriptedSource`] returns next.
#[derive(Debug, Clone)]
pub struct ScriptHandle {
    script: Arc<Mutex<Script>>,
}

impl ScriptedSource {
    /// `initial` is returned until something is queued or set.
    pub fn new(initial: MemSample) -> Self {
        Self {
            script: Arc::new(Mutex::new(Script {
                queue: VecDeque::new(),
                last: initial,
                samples_taken: 0,
            })),
        }
    }

    /// A sample with the given total and free bytes (available = free, no PSI).
    pub fn sample(total_bytes: u64, free_bytes: u64) -> MemSample {
        MemSample {
            total_bytes,
            free_bytes,
            available_bytes: free_bytes,
            psi: None,
        }
    }

    /// A handle the test moves the scripted figures with.
    pub fn handle(&self) -> ScriptHandle {
        ScriptHandle {
            script: Arc::clone(&self.script),
        }
    }
}

fn lock(m: &Mutex<Script>) -> std::sync::MutexGuard<'_, Script> {
    // A panicking test thread must not hide the script from the others.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ScriptHandle {
    /// Queues samples to return, in order, before repeating the last one.
    pub fn push(&self, samples: impl IntoIterator<Item = MemSample>) {
        lock(&self.script).queue.extend(samples);
    }

    /// Drops the queue: every later call returns `sample`.
    pub fn set(&self, sample: MemSample) {
        let mut s = lock(&self.script);
        s.queue.clear();
        s.last = sample;
    }

    /// How many samples the source has handed out.
    pub fn samples_taken(&self) -> u64 {
        lock(&self.script).samples_taken
    }
}

impl MemorySource for ScriptedSource {
    fn sample(&mut self) -> Result<MemSample, AutoError> {
        let mut s = lock(&self.script);
        s.samples_taken += 1;
        if let Some(next) = s.queue.pop_front() {
            s.last = next;
        }
        Ok(s.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_queue_then_repeats_last() {
        let mut src = ScriptedSource::new(ScriptedSource::sample(100, 90));
        let h = src.handle();
        assert_eq!(src.sample().unwrap().free_bytes, 90);
        h.push([
            ScriptedSource::sample(100, 10),
            ScriptedSource::sample(100, 20),
        ]);
        assert_eq!(src.sample().unwrap().free_bytes, 10);
        assert_eq!(src.sample().unwrap().free_bytes, 20);
        assert_eq!(src.sample().unwrap().free_bytes, 20);
        h.set(ScriptedSource::sample(100, 50));
        assert_eq!(src.sample().unwrap().free_bytes, 50);
        assert_eq!(h.samples_taken(), 5);
    }
}
