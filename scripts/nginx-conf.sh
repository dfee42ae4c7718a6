# Sourced by scripts/cluster.sh and load-tests/cluster-bench.sh: the nginx configuration of
# docs/deploy.md (round robin, no stickiness, bodies streamed both ways) in one place.
#
#   write_nginx_conf DIR LISTEN_PORT KEEPALIVE UPSTREAM_PORT...
#
# writes DIR/nginx.conf (temp folders and logs under DIR); KEEPALIVE 0 leaves the `keepalive`
# line out (a new connection to a node per request).
write_nginx_conf() {
	local d=$1 listen=$2 keepalive=$3 ups=""
	shift 3
	mkdir -p "$d"
	for u in "$@"; do ups+="    server 127.0.0.1:$u;"$'\n'; done
	if [ "$keepalive" -gt 0 ]; then ups+="    keepalive $keepalive;"$'\n'; fi
	cat >"$d/nginx.conf" <<EOF_CONF
daemon off;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 0;
  client_body_temp_path $d/client_body;
  proxy_temp_path $d/proxy;
  fastcgi_temp_path $d/fastcgi;
  uwsgi_temp_path $d/uwsgi;
  scgi_temp_path $d/scgi;
  upstream synkronus {
$ups  }
  server {
    listen 127.0.0.1:$listen;
    location / {
      proxy_pass http://synkronus;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_request_buffering off;
      proxy_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
EOF_CONF
}
