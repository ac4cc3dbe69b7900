//! ioeventfd handling for virtio-mmio devices.
//!
//! With an ioeventfd, KVM completes the guest's QueueNotify write in the
//! kernel and signals an EventFd instead of exiting to a vCPU thread. This
//! subscriber of the VMM's event manager reads those EventFds and runs the
//! queue on the event-manager thread.

use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::{error, warn};
use vmm_sys_util::eventfd::EventFd;

use super::MmioTransport;

/// Errors building a notifier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot duplicate a queue eventfd: {0}")]
    Clone(std::io::Error),
}

/// Event-manager subscriber for the queue EventFds of one transport.
pub struct MmioNotifier {
    transport: Arc<Mutex<MmioTransport>>,
    evts: Vec<EventFd>,
}

impl MmioNotifier {
    /// Watches duplicates of `transport`'s queue EventFds (the same
    /// eventfds the VMM registers as ioeventfds).
    pub fn new(transport: Arc<Mutex<MmioTransport>>) -> Result<Self, Error> {
        let evts = {
            let t = transport.lock().unwrap_or_else(|e| e.into_inner());
            t.queue_evts()
                .iter()
                .map(EventFd::try_clone)
                .collect::<Result<Vec<_>, _>>()
                .map_err(Error::Clone)?
        };
        Ok(Self { transport, evts })
    }
}

impl MutEventSubscriber for MmioNotifier {
    fn init(&mut self, ops: &mut EventOps) {
        for (i, evt) in self.evts.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(evt, i as u32, EventSet::IN)) {
                error!("virtio-mmio: cannot watch queue {i} eventfd: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let index = events.data() as usize;
        let Some(evt) = self.evts.get(index) else {
            warn!("virtio-mmio: event for unknown queue {index}");
            return;
        };
        if events
            .event_set()
            .intersects(EventSet::ERROR | EventSet::HANG_UP)
        {
            error!("virtio-mmio: queue {index} eventfd failed; no longer watched");
            let _ = ops.remove(events);
            return;
        }
        // Non-blocking: a spurious wake-up reads EAGAIN and is harmless.
        if evt.read().is_err() {
            return;
        }
        self.transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notify_queue(index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::mmio::tests::{driver_init, Harness};
    use event_manager::{EventManager, SubscriberOps};

    #[test]
    fn ioeventfd_drives_the_queue() {
        let h = Harness::new();
        let transport = Arc::new(Mutex::new(h.transport()));
        driver_init(&mut transport.lock().unwrap(), &h);
        h.push_get_id();
        let notifier = MmioNotifier::new(transport.clone()).unwrap();
        let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
        em.add_subscriber(Box::new(notifier));
        // What KVM does on the guest's QueueNotify write:
        transport.lock().unwrap().queue_evts()[0].write(1).unwrap();
        assert!(em.run_with_timeout(1000).unwrap() >= 1);
        assert_eq!(h.used_idx(), 1);
        assert_eq!(h.irq_count(), 1);
        assert_eq!(transport.lock().unwrap().interrupt().status(), 1);
    }
}
