# The shape `nomad volume init` writes for a CSI volume, accepted unchanged by both
# `berth volume register` and `berth volume create`. Fields only one of the commands uses are
# ignored by the other, with a warning that names them.
id        = "ebs_prod_db1"
namespace = "default"
name      = "database"
type      = "csi"
plugin_id = "plugin_id"

# register: the storage provider's id of an existing volume (create ignores it).
external_id = "vol-23452345"

# create: a snapshot (or, instead, clone_id) to start from (register ignores it).
snapshot_id = "snap-12345"

# create: the size range asked for; register records it as the volume's capacity.
capacity_min = "10GiB"
capacity_max = "20G"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["ro"]
}

# preferred: create only (register ignores it); required: where the volume is reachable.
topology_request {
  preferred {
    topology { segments { rack = "R1" } }
  }
  required {
    topology { segments { rack = "R1" } }
    topology { segments { rack = "R2", zone = "us-east-1a" } }
  }
}

secrets {
  example_secret = "xyzzy"
}

parameters {
  skuname = "Premium_LRS"
}

# register: what the plugin expects as the volume's context (create ignores it: the plugin
# returns the context of a volume it creates).
context {
  endpoint = "http://192.168.1.101:9425"
}
