# A batch job whose exec task holds one device of the example device plugin that
# `berth agent --dev` runs (devices = files in <data_dir>/dev-devices, group berth/file/mock).
# `berth job run examples/device-job.hcl`.
job "device-demo" {
  type = "batch"

  group "demo" {
    task "show" {
      driver = "exec"

      config {
        command = "/bin/sh"
        # What the device gives the task: env from the plugin's Reserve answer, and the device
        # file mounted read-only at /device/<id>.
        args = ["-c", "env | grep '^BERTH_DEVICE' | sort; cat /device/*"]
      }

      resources {
        device "berth/file/mock" {
          count = 1

          # Nomad's forms: constraints must hold, affinities rank the groups that fit.
          constraint {
            attribute = "${device.vendor}"
            value     = "berth"
          }

          affinity {
            attribute = "${device.model}"
            operator  = "="
            value     = "mock"
            weight    = 50
          }
        }
      }
    }
  }
}
