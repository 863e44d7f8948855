//! What the device manager asks of one connection to a plugin ([`PluginOps`]): `Allocate`,
//! `GetPreferredAllocation` and `PreStartContainer`, each with a deadline, each answer checked.

use std::{collections::HashSet, future::Future, sync::Mutex, time::Duration};

use berth_devices::{
    BoxFuture, grpc,
    model::ContainerEdits,
    plugin::{PluginError, PluginId, PluginOps},
};
use berth_input::Quoted;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};

use crate::{
    edits::container_edits,
    proto::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
        DevicePluginOptions, PreStartContainerRequest, PreferredAllocationRequest,
        device_plugin_client::DevicePluginClient,
    },
};

/// The client of one plugin.
pub(crate) type Client = DevicePluginClient<Channel>;

/// One connection to a plugin, shared by the instance task that follows it and the ops given
/// to the manager. Once closed, every call fails with `Unavailable` and calls in flight are
/// abandoned.
#[derive(Debug)]
pub(crate) struct Conn {
    client: Mutex<Option<Client>>,
    closed: CancellationToken,
}

impl Conn {
    /// A live connection through `client`.
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client: Mutex::new(Some(client)),
            closed: CancellationToken::new(),
        }
    }

    /// The client, while the connection is live.
    fn client(&self) -> Option<Client> {
        self.client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Marks the connection dead and lets go of its channel. Idempotent.
    pub(crate) fn close(&self) {
        self.client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        self.closed.cancel();
    }
}

/// The deadlines of the calls the manager makes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// `Allocate`, `GetPreferredAllocation`.
    pub call: Duration,
    /// `PreStartContainer`.
    pub pre_start: Duration,
}

/// [`PluginOps`] over one connection to a Kubernetes device plugin, with the options it gave
/// on that connection.
#[derive(Debug)]
pub(crate) struct KubeOps {
    plugin: PluginId,
    conn: std::sync::Arc<Conn>,
    options: DevicePluginOptions,
    deadlines: Deadlines,
}

impl KubeOps {
    pub(crate) fn new(
        plugin: PluginId,
        conn: std::sync::Arc<Conn>,
        options: DevicePluginOptions,
        deadlines: Deadlines,
    ) -> Self {
        Self {
            plugin,
            conn,
            options,
            deadlines,
        }
    }

    /// Sends one call through the live connection with deadline `after`; maps every failure.
    async fn call<T, F, Fut>(&self, name: &str, after: Duration, f: F) -> Result<T, PluginError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let Some(client) = self.conn.client() else {
            return Err(self.unavailable("its connection is down; waiting for it to come back"));
        };
        tokio::select! {
            () = self.conn.closed.cancelled() => {
                Err(self.unavailable("its connection went down during the call"))
            }
            r = tokio::time::timeout(after, f(client)) => match r {
                Err(_) => Err(self.timeout(name, after)),
                Ok(Ok(resp)) => Ok(resp.into_inner()),
                Ok(Err(status)) => Err(grpc::plugin_error(&self.plugin, name, after, &status)),
            }
        }
    }

    fn unavailable(&self, reason: &str) -> PluginError {
        PluginError::Unavailable {
            plugin: self.plugin.clone(),
            reason: reason.to_string(),
        }
    }

    fn timeout(&self, call: &str, after: Duration) -> PluginError {
        PluginError::Timeout {
            plugin: self.plugin.clone(),
            call: call.to_string(),
            after,
        }
    }

    /// The one container response of an answer to one container request.
    fn single<T>(&self, call: &str, responses: Vec<T>) -> Result<T, PluginError> {
        let n = responses.len();
        responses
            .into_iter()
            .next()
            .filter(|_| n == 1)
            .ok_or_else(|| {
                self.bad_answer(
                    call,
                    format!("{n} container responses for 1 container request"),
                )
            })
    }

    fn bad_answer(&self, call: &str, reason: String) -> PluginError {
        PluginError::BadAnswer {
            plugin: self.plugin.clone(),
            call: call.to_string(),
            reason,
        }
    }
}

/// A request carrying its deadline, so the plugin knows it too.
pub(crate) fn request<T>(msg: T, after: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(after);
    r
}

impl PluginOps for KubeOps {
    /// `Allocate` with one container request for `device_ids`; the answer must hold exactly
    /// one container response, whose paths are absolute.
    fn reserve<'a>(
        &'a self,
        device_ids: &'a [String],
    ) -> BoxFuture<'a, Result<ContainerEdits, PluginError>> {
        Box::pin(async move {
            const CALL: &str = "Allocate";
            let after = self.deadlines.call;
            let msg = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: device_ids.to_vec(),
                }],
            };
            let resp = self
                .call(CALL, after, |mut c| async move {
                    c.allocate(request(msg, after)).await
                })
                .await?;
            let container = self.single(CALL, resp.container_responses)?;
            container_edits(container).map_err(|reason| self.bad_answer(CALL, reason))
        })
    }

    /// `GetPreferredAllocation` when the plugin offers it (`Ok(None)` otherwise); the answer
    /// must name `size` distinct ids of `available`, every one of `must_include` among them.
    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        must_include: &'a [String],
        size: usize,
    ) -> BoxFuture<'a, Result<Option<Vec<String>>, PluginError>> {
        Box::pin(async move {
            const CALL: &str = "GetPreferredAllocation";
            if !self.options.get_preferred_allocation_available {
                return Ok(None);
            }
            let after = self.deadlines.call;
            let msg = PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.to_vec(),
                    must_include_device_i_ds: must_include.to_vec(),
                    allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
                }],
            };
            let resp = self
                .call(CALL, after, |mut c| async move {
                    c.get_preferred_allocation(request(msg, after)).await
                })
                .await?;
            let container = self.single(CALL, resp.container_responses)?;
            let ids = container.device_i_ds;
            check_preferred(&ids, available, must_include, size)
                .map_err(|reason| self.bad_answer(CALL, reason))?;
            Ok(Some(ids))
        })
    }

    fn pre_start_required(&self) -> bool {
        self.options.pre_start_required
    }

    /// `PreStartContainer` for `device_ids` when the plugin asked for it, with the pre-start
    /// deadline; nothing otherwise.
    fn pre_start<'a>(&'a self, device_ids: &'a [String]) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            if !self.options.pre_start_required {
                return Ok(());
            }
            let after = self.deadlines.pre_start;
            let msg = PreStartContainerRequest {
                devices_ids: device_ids.to_vec(),
            };
            self.call("PreStartContainer", after, |mut c| async move {
                c.pre_start_container(request(msg, after)).await
            })
            .await
            .map(|_| ())
        })
    }
}

/// Whether `ids` answers "which `size` of `available`, including `must_include`".
fn check_preferred(
    ids: &[String],
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Result<(), String> {
    if ids.len() != size {
        return Err(format!("{} devices named, {size} asked for", ids.len()));
    }
    let available: HashSet<&str> = available.iter().map(String::as_str).collect();
    let mut seen = HashSet::new();
    for id in ids {
        if !available.contains(id.as_str()) {
            return Err(format!(
                "device {} is not among those available",
                Quoted(id)
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err(format!("device {} is named twice", Quoted(id)));
        }
    }
    if let Some(missing) = must_include.iter().find(|m| !seen.contains(m.as_str())) {
        return Err(format!(
            "device {} must be included and is not",
            Quoted(missing)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn preferred_answers_are_checked() {
        let avail = ids(&["a", "b", "c"]);
        let must = ids(&["b"]);
        assert_eq!(check_preferred(&ids(&["b", "a"]), &avail, &must, 2), Ok(()));
        for (answer, want) in [
            (ids(&["b"]), "1 devices named, 2 asked for"),
            (ids(&["b", "z"]), "\"z\" is not among those available"),
            (ids(&["b", "b"]), "\"b\" is named twice"),
            (ids(&["a", "c"]), "\"b\" must be included"),
        ] {
            let err = check_preferred(&answer, &avail, &must, 2).expect_err(want);
            assert!(err.contains(want), "{err}");
        }
    }
}
