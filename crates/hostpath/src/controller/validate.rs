//! ValidateVolumeCapabilities.

use berth_csi::pb::{self, validate_volume_capabilities_response};
use tonic::{Code, Status};

use crate::{caps, image, plugin::Plugin, strict};

impl Plugin {
    pub(super) async fn validate_volume_capabilities(
        &self,
        req: &pb::ValidateVolumeCapabilitiesRequest,
    ) -> Result<pb::ValidateVolumeCapabilitiesResponse, Status> {
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        self.volume(id).await?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let mut unsupported = None;
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            let field = format!("volume_capabilities[{i}]");
            match caps::capability(cap, &field, Code::FailedPrecondition) {
                Ok(c) if !self.fs_type_supported(&c) => {
                    unsupported.get_or_insert_with(|| {
                        format!(
                            "{field}: this plugin's volumes are {} filesystems",
                            image::FS_TYPE
                        )
                    });
                }
                Ok(_) => {}
                Err(s) if s.code() == Code::FailedPrecondition => {
                    unsupported.get_or_insert_with(|| s.message().to_owned());
                }
                Err(s) => return Err(s),
            }
        }
        if self.settings.strict {
            strict::volume_context(&req.volume_context)?;
        }
        Ok(match unsupported {
            Some(message) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: req.mutable_parameters.clone(),
                }),
                message: String::new(),
            },
        })
    }
}
