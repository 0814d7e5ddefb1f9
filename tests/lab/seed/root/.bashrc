# The lab VM's root: an empty ~/.bashrc of its own. Debian's bash reads
# ~/.bashrc for every command sshd runs, and without this file the VM would
# read the lab host's (over 9p), whose tool set-ups (pyenv init and the like)
# fork dozens of processes: tens of seconds per ssh command under emulation.
