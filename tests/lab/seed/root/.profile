# The lab VM's root: no login-shell set-up from the lab host's ~/.profile.
