# Sourced by the GPU-machine scripts that build more than the engine: unpacks the carried
# .devdebs (ZeroMQ, SQLite, PCRE2, utf8proc as the shared docs/device.md lists them, and since
# the PostgreSQL queue libpq: `apt-get download libpq5 libpq-dev libldap-2.5-0 libgssapi-krb5-2
# libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libsasl2-2 libsasl2-modules-db
# libcom-err2` into .devdebs too) into /opt/deb and points the build and the loader at them.
# Sets D (the prefix) and LIB.
mkdir -p /opt/deb
for f in .devdebs/*.deb; do dpkg -x "$f" /opt/deb; done
D=/opt/deb/usr
LIB=$D/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB
export PKG_CONFIG_PATH=$LIB/pkgconfig:$D/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=/opt/deb
