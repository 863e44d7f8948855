# Values for hcl2-vars.hcl (`-var-file`); a -var on the command line wins over these.
greeting = "Bonjour"
names    = ["ada", "grace"]
