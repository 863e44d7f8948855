# HCL2 variables, locals and functions, evaluated when the job is read; run it with
#   berth job run -var-file examples/nomad/jobs/hcl2-vars.vars.hcl -var shout=true examples/nomad/jobs/hcl2-vars.hcl
variable "greeting" {
  type        = string
  description = "What the task says"
  default     = "hello"
}

variable "names" {
  type    = list(string)
  default = ["ada"]
}

variable "shout" {
  type    = bool
  default = false
}

variable "copies" {
  type    = number
  default = 1
}

locals {
  line    = "${var.greeting}, ${join(" and ", var.names)}"
  said    = var.shout ? upper(local.line) : local.line
  outfile = "/data/hcl2-vars/${lower(var.greeting)}.txt"
}

job "hcl2-vars" {
  type = "batch"

  group "say" {
    count = var.copies

    volume "data" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }

    task "say" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "mkdir -p /data/hcl2-vars && echo \"$0 ($1 names)\" > ${local.outfile}", local.said, "${length(var.names)}"]
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
