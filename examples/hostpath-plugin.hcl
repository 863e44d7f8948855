# berth-hostpath run as a task: berth registers it as the CSI plugin "hostpath" (a monolith:
# node and controller) and supervises it. `berth job run examples/hostpath-plugin.hcl`.
#
# The task gets CSI_ENDPOINT=unix:///csi/csi.sock (its socket directory is mounted at
# mount_dir) and sees the plugin's staging and publish root at stage_publish_base_dir, with
# bidirectional propagation: what it mounts there shows on the host. Under `berth agent --dev`
# this instance is newer than the one the agent runs, so it serves the plugin's volumes.
job "hostpath-plugin" {
  type = "service"

  group "plugin" {
    task "hostpath" {
      driver = "exec"

      config {
        command = "berth-hostpath"
        # Relative to the task's working directory: the volumes live in the alloc's directory.
        # --strict: it refuses any request where the CO (berth) skips a duty the CSI spec puts
        # on it, such as making the staging directory.
        args = ["--statedir=state", "--strict"]
      }

      csi_plugin {
        id                     = "hostpath"
        type                   = "monolith"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
        health_timeout         = "30s"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
