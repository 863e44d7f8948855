# The job of HashiCorp Nomad's e2e/csi/input/plugin-aws-ebs-nodes.nomad (a node plugin on
# every Linux node), key for key, with one change: the image is berth's own hostpath CSI
# plugin, built locally, instead of the AWS EBS driver.
job "plugin-aws-ebs-nodes" {

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  type = "system"

  group "nodes" {
    task "plugin" {
      driver = "docker"

      config {
        image = "localhost/berth-hostpath:latest"

        args = [
          "node",
          "--endpoint=${CSI_ENDPOINT}",
          "--logtostderr",
          "--v=5",
        ]

        privileged = true
      }

      csi_plugin {
        id        = "aws-ebs0"
        type      = "node"
        mount_dir = "/csi"
      }

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
