#!/bin/bash
# Starts a systemd service the way systemd would, where no systemd runs (the Debian package test's
# container): its StateDirectory= (owner, mode), UMask=, User=/Group=, Environment= and
# EnvironmentFile= (alone: the rest of the environment cleared), WorkingDirectory=, then
# ExecStart= in the foreground, its pid in /run/<unit>.pid.
#
#   run-unit.sh /lib/systemd/system/synkronus.service
set -euo pipefail
unit=$1
get() { sed -n "s/^$1=//p" "$unit"; }

user=$(get User) group=$(get Group)
for dir in $(get StateDirectory); do
	install -d -o "$user" -g "$group" -m "$(get StateDirectoryMode)" "/var/lib/$dir"
	chown "$user:$group" "/var/lib/$dir"
done
env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
while read -r assignment; do [ -n "$assignment" ] && env+=("$assignment"); done < <(get Environment)
envfile=$(get EnvironmentFile)
while read -r line; do
	case "$line" in '' | '#'*) ;; *) env+=("$line") ;; esac
done <"${envfile#-}"
umask "$(get UMask)"
cd "$(get WorkingDirectory)"
echo $$ >"/run/$(basename "$unit" .service).pid"
# shellcheck disable=SC2046
exec setpriv --reuid="$user" --regid="$group" --init-groups --no-new-privs \
	env -i "${env[@]}" $(get ExecStart)
