# berth-hostpath run as a task: berth registers it as the CSI plugin "hostpath" and
# supervises it. `berth job run examples/hostpath-plugin.hcl`.
job "hostpath-plugin" {
  type = "service"

  group "plugin" {
    task "hostpath" {
      driver = "exec"

      config {
        command = "berth-hostpath"
        # Taken literally (berth does not interpolate): the socket is csi.sock in mount_dir.
        args = [
          "--endpoint=unix:///csi/csi.sock",
          "--statedir=/var/lib/berth-hostpath",
        ]
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
