# One volume mounted three times with each of Nomad's propagation modes; the task writes the
# propagation of each mount point (from its /proc/self/mountinfo) and whether it runs as root
# (`user`) into the volume. `selinux_label` and `restart.render_templates` are accepted.
job "propagation" {
  type = "batch"

  group "modes" {
    volume "data" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }

    restart {
      attempts         = 0
      mode             = "fail"
      render_templates = false
    }

    task "show" {
      driver = "exec"
      user   = "root"

      config {
        command  = "/bin/sh"
        args     = ["-c", "mkdir -p /private/propagation && for m in /private /slave; do grep \" $m \" /proc/self/mountinfo | head -1 | cut -d' ' -f5- ; done > /private/propagation/mountinfo.txt && id -u > /private/propagation/uid.txt"]
        pid_mode = "private"
      }

      volume_mount {
        volume           = "data"
        destination      = "/private"
        propagation_mode = "private"
        selinux_label    = "z"
      }

      volume_mount {
        volume           = "data"
        destination      = "/slave"
        propagation_mode = "host-to-task"
      }
    }
  }
}
