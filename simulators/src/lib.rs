//! Stand-ins for the world around pixgate: receipt printers over MQTT ([`printer`]), on a
//! raw byte transport ([`raw_printer`]), as a Star CloudPRNT printer ([`cloudprnt`] polling
//! over HTTP, [`cloudprnt_mqtt`] over MQTT when the server offers it) or as an Epson TM printer
//! using Server Direct Print ([`sdp`]),
//! card machines ([`terminal`]), a fleet of both on one broker ([`fleet`], [`device`]), and
//! the upstream capture job ([`capture`]). What a device makes of a job (the paper, the
//! screen) is the `preview` crate's.

pub mod capture;
pub mod cli;
pub mod cloudprnt;
pub mod cloudprnt_mqtt;
pub mod device;
pub mod effect;
pub mod expected;
pub mod fleet;
pub mod mqtt_link;
pub mod printer;
pub mod raw_printer;
pub mod registry;
pub mod sdp;
pub mod terminal;
