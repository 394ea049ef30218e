# Sourced by the GPU-machine scripts that build more than the engine: unpacks the carried
# .devdebs (ZeroMQ, SQLite, PCRE2, utf8proc; see the shared docs/device.md) into /opt/deb and
# points the build and the loader at them. Sets D (the prefix) and LIB.
mkdir -p /opt/deb
for f in .devdebs/*.deb; do dpkg -x "$f" /opt/deb; done
D=/opt/deb/usr
LIB=$D/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB
export PKG_CONFIG_PATH=$LIB/pkgconfig:$D/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=/opt/deb
