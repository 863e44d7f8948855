# Two exec tasks of one alloc that look for everything they must not see: the host's `/`, the
# agent's data dir (given as -var data_dir=…), places outside their volume to write to, and each
# other's secrets. Each writes what it found into the volume under /data/isolation/<task>/.
variable "data_dir" {
  type = string
}

locals {
  probe = <<-EOT
    set -u
    me=$NOMAD_TASK_NAME other=$1 out=/data/isolation/$NOMAD_TASK_NAME
    mkdir -p $out
    ls -A / > $out/root.txt
    id -u > $out/uid.txt
    if ls -A "$DATA_DIR" > /dev/null 2>&1; then echo visible; else echo hidden; fi > $out/datadir.txt
    for p in /probe /etc/probe /usr/probe /bin/probe /local/../probe; do
      if (echo x > "$p") 2>/dev/null; then echo "$p written"; else echo "$p refused"; fi
    done > $out/writes.txt
    echo "secret-of-$me" > /secrets/token
    : > /alloc/data/$me-ready
    i=0
    while [ ! -e /alloc/data/$other-ready ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    for p in /secrets/../$other/secrets/token /alloc/../$other/secrets/token \
             "$DATA_DIR/allocs/$NOMAD_ALLOC_ID/$other/secrets/token"; do
      cat "$p" 2>/dev/null
    done > $out/others-secret.txt
    cat /secrets/token > $out/own-secret.txt
    ls /proc | grep -c '^[0-9]' > $out/pids.txt
    echo done > $out/done.txt
  EOT
}

job "isolation" {
  type = "batch"

  group "pair" {
    volume "data" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }

    task "a" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", local.probe, "probe", "b"]
      }
      env {
        DATA_DIR = var.data_dir
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }

    task "b" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", local.probe, "probe", "a"]
      }
      env {
        DATA_DIR = var.data_dir
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
