# A batch job that writes to the CSI volume "demo" (see examples/volume.hcl), mounted at
# /data. `berth job run examples/writer.hcl`.
job "writer" {
  type = "batch"

  group "writer" {
    volume "data" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }

    task "write" {
      driver = "exec"

      config {
        command = "/bin/sh"
        # Its output: berth alloc logs <alloc> (files <data_dir>/allocs/<alloc>/logs/write.stdout.0…).
        args = ["-c", "echo hello > /data/hello.txt && echo wrote /data/hello.txt"]
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
