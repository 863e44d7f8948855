# Nomad's runtime variables, the node's attributes and meta, and the task's own env, written
# where Nomad interpolates them: the command's args, env values and a volume_mount's
# destination. The task writes what it got into its volume: args.txt (one argument per line)
# and env.txt (its environment).
job "runtime-vars" {
  datacenters = ["dc1"]
  type        = "batch"

  group "echo" {
    volume "data" {
      type            = "csi"
      source          = "demo"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "echo" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args = [
          "-c",
          "out=/data/${NOMAD_JOB_NAME}; mkdir -p $out && printf '%s\\n' \"$@\" > $out/args.txt && env > $out/env.txt",
          "echo",
          "${NOMAD_ALLOC_ID}",
          "${NOMAD_ALLOC_INDEX}",
          "${NOMAD_ALLOC_NAME}",
          "${NOMAD_JOB_ID}",
          "${NOMAD_GROUP_NAME}",
          "${NOMAD_TASK_NAME}",
          "${NOMAD_ALLOC_DIR}",
          "${NOMAD_TASK_DIR}",
          "${NOMAD_SECRETS_DIR}",
          "${NOMAD_DC}",
          "${NOMAD_REGION}",
          "${NOMAD_NAMESPACE}",
          "${attr.kernel.name}",
          "${attr.unique.hostname}",
          "${attr.driver.exec}",
          "${node.unique.name}",
          "${node.datacenter}",
          "${node.class}",
          "${meta.rack}",
          "${GREETING}",
          "literal $${NOMAD_TASK_NAME}",
        ]
      }

      env {
        GREETING   = "hello from ${NOMAD_TASK_NAME} in ${node.datacenter}"
        STATIC     = "plain"
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
