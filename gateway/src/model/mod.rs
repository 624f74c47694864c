//! Records shared by the stages: jobs as stored and queued ([`job`]), dead letters
//! ([`dead_letter`]) and why ([`reason`]), which devices may connect ([`directory`]), which printers pixgate drives itself and where they are ([`direct_printers`], [`endpoint`]), printers that poll it over their maker's cloud protocol ([`cloud_printer`]), what passes between the consumer and the dispatcher ([`handoff`]),
//! a job between the central shape's stages ([`device_job`]) and its partition
//! ([`device_partition`]) and the deliver stage's log
//! ([`delivery_log`]), the effect flags of a
//! cutover ([`flags`]), and a Kafka partition's name ([`Partition`]).

pub mod cloud_printer;
pub mod dead_letter;
pub mod delivery_log;
pub mod device_job;
pub mod device_partition;
pub mod direct_printers;
pub mod directory;
pub mod endpoint;
pub mod flags;
pub mod handoff;
pub mod job;
pub mod reason;

pub use cloud_printer::CloudSettings;
pub use dead_letter::DeadLetter;
pub use device_job::DeviceJobRecord;
pub use direct_printers::{DirectPrinters, DirectSettings};
pub use directory::{Directory, Standing};
pub use flags::EffectFlags;
pub use handoff::{Command, Finished, Incoming, Outcome};
pub use job::{Queued, SourceRef, StoredJob};
pub use reason::{DeadLetterReason, IgnoreReason};

/// A Kafka partition: (topic, partition number).
pub type Partition = (String, i32);
