# A volume for `berth volume create examples/volume.hcl` (the same file works with
# `nomad volume create`). berth-hostpath, run by `berth agent --dev`, is the plugin.
id        = "demo"
name      = "demo"
type      = "csi"
plugin_id = "hostpath"

capacity_min = "64MiB"
capacity_max = "1GiB"

# One writer (and readers) on this node.
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# Several allocs of this node may mount it read-write at once.
capability {
  access_mode     = "single-node-multi-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}

mount_options {
  mount_flags = ["noatime"]
}

# Passed to every CSI call that takes secrets; never shown again.
secrets {
  token = "not-a-real-token"
}

parameters {
  tier = "demo"
}
