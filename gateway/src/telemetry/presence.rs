//! Which devices are connected now, as the transport that holds their connections sees it:
//! pixgate's own MQTT hub on the edge box; on the central shape, the devices' retained
//! `status` messages on the external broker. The dashboard reads it through [`Presence`]
//! and so does not depend on either.

use std::collections::HashMap;

/// A device's connections now: (live connections, how many of them are subscribed to its
/// `jobs` topic).
pub type Connections = (usize, usize);

/// Who is connected.
pub trait Presence: Send + Sync {
    /// Devices with at least one live connection: device id → [`Connections`].
    fn online(&self) -> HashMap<String, Connections>;
}
