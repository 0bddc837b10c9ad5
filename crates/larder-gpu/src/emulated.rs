//! A [`Device`] on the CPU: host and "device" buffers are separate vectors, uploads and
//! device copies move bytes between them, the scan is [`emulate_scan`] of the device
//! bytes and the hashes are larder-hash's of the device bytes. The pipeline runs on it
//! unchanged, so a wrong upload range, warm-up or leftover copy changes cut points or
//! fingerprints and fails `tests/pipeline_emulated.rs`, without a GPU. It models data
//! movement, not timing or concurrency.

use std::ops::Range;

use larder_hash::{Fingerprint, HashAlgo};

use crate::pipeline::Device;
use crate::stretch::{emulate_scan, ScanLayout, ScanOutput};
use crate::Error;

/// The emulated device.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmulatedDevice;

/// One slot's buffers. `device` starts as 0xA5 bytes, so that reading a byte that was
/// never uploaded or copied shows up as a wrong result rather than a lucky zero.
#[derive(Debug)]
pub struct EmulatedSlot {
    host: Vec<u8>,
    device: Vec<u8>,
    output: ScanOutput,
}

impl Device for EmulatedDevice {
    type Slot = EmulatedSlot;

    fn new_slot(
        &self,
        bytes: usize,
        _threads: usize,
        _slots: usize,
    ) -> Result<EmulatedSlot, Error> {
        Ok(EmulatedSlot {
            host: vec![0; bytes],
            device: vec![0xA5; bytes],
            output: ScanOutput::default(),
        })
    }

    fn host<'s>(&self, slot: &'s mut EmulatedSlot) -> Result<&'s mut [u8], Error> {
        Ok(&mut slot.host)
    }

    fn upload(&self, slot: &mut EmulatedSlot, range: Range<usize>) -> Result<(), Error> {
        slot.device[range.clone()].copy_from_slice(&slot.host[range]);
        Ok(())
    }

    fn scan(
        &self,
        slot: &mut EmulatedSlot,
        layout: &ScanLayout,
        masks: (u64, u64),
    ) -> Result<(), Error> {
        slot.output = emulate_scan(&slot.device, layout, masks);
        Ok(())
    }

    fn wait(&self, _slot: &mut EmulatedSlot) -> Result<(), Error> {
        Ok(())
    }

    fn scan_output(
        &self,
        slot: &mut EmulatedSlot,
        _layout: &ScanLayout,
    ) -> Result<ScanOutput, Error> {
        Ok(std::mem::take(&mut slot.output))
    }

    fn hash(
        &self,
        slot: &mut EmulatedSlot,
        offsets: &[u64],
        algo: HashAlgo,
    ) -> Result<Vec<Fingerprint>, Error> {
        Ok(offsets
            .windows(2)
            .map(|w| algo.fingerprint(&slot.device[w[0] as usize..w[1] as usize]))
            .collect())
    }

    fn copy_device(
        &self,
        from: &mut EmulatedSlot,
        to: &mut EmulatedSlot,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), Error> {
        to.device[dst..dst + len].copy_from_slice(&from.device[src..src + len]);
        Ok(())
    }
}
