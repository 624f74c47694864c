//! A printer that fetches its own jobs over its maker's cloud protocol (Star CloudPRNT, the
//! HTTP or the MQTT method): who it is (its MAC), how it hears of its jobs and the paper
//! they are drawn for. The registry
//! writes these into [`crate::model::DirectPrinters`]; the CloudPRNT server
//! (`deliver::cloudprnt`) reads them at every request.

use render::codepage::CodePage;

/// One printer on a maker's cloud protocol, from its registry document
/// (`printer.transport` `cloudprnt-http`, `cloudprnt-mqtt` or `epson-sdp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudSettings {
    /// `printer.mac`, normalized (`00:11:62:0a:1b:2c`): a Star printer's poll's
    /// `printerMAC` and the `mac` of its job requests must be this. `None` for Epson's.
    pub mac: Option<String>,
    /// Which protocol it fetches its jobs with.
    pub method: cdc::CloudMethod,
    /// Print head width in dots the job's picture is drawn at (`printer.paperWidthMm` on
    /// the model's profile: 576 for 80 mm, 384 for 58 mm on most heads). Star's guide: a
    /// PNG is printed pixel for pixel, unscaled.
    pub width_dots: u32,
    /// `printer.codePage`: the code table the receipt's text was encoded in.
    pub code_page: CodePage,
    /// `model`: whose `ESC t n` numbering the receipt follows.
    pub model: String,
}

impl CloudSettings {
    /// The settings of `device` if its registry document names a cloud transport.
    pub fn of_device(device: &cdc::Device) -> Option<CloudSettings> {
        let cdc::DeviceKind::Printer { cloud: Some(c), paper_width_mm, code_page, .. } = &device.kind else {
            return None;
        };
        let profile = render::profile::profile_for_model(&device.model);
        Some(CloudSettings {
            mac: c.mac.clone(),
            method: c.method,
            width_dots: profile.dots_per_line(*paper_width_mm),
            code_page: *code_page,
            model: device.model.clone(),
        })
    }
}
