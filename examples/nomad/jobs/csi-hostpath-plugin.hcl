# The job of HashiCorp Nomad's demo/csi/hostpath/plugin.nomad, key for key, with one change:
# the image is berth's own hostpath CSI plugin, built locally, instead of the Kubernetes one.
job "csi-plugin" {
  type        = "system"
  datacenters = ["dc1"]

  group "csi" {

    task "plugin" {
      driver = "docker"

      config {
        image = "localhost/berth-hostpath:latest"

        args = [
          "--drivername=csi-hostpath",
          "--v=5",
          "--endpoint=${CSI_ENDPOINT}",
          "--nodeid=node-${NOMAD_ALLOC_INDEX}",
        ]

        privileged = true
      }

      csi_plugin {
        id        = "hostpath-plugin0"
        type      = "monolith"
        mount_dir = "/csi"
      }

      resources {
        cpu    = 256
        memory = 128
      }
    }
  }
}
