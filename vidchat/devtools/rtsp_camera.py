"""An IP camera for the streams tests: GStreamer's RTSP server on loopback
sending H.264 test video (``videotestsrc``: colour bars sliding sideways, so
every frame differs enough for the filter to keep it), 320x240 at 10 fps;
with ``--audio``, AAC beside it (a 440 Hz tone, 16 kHz mono), as most IP
cameras send.

Run by the system python3 (Debian's python3-gi and GStreamer packages, which
scripts/setup.sh installs for the tests), not the project's venv:

    /usr/bin/python3 vidchat/devtools/rtsp_camera.py --port 8554 [--path /cam] [--audio]

It prints "ready rtsp://127.0.0.1:PORT/PATH" once it listens and serves until
killed. Imports nothing of vidchat (vidchat.devtools.stream_sources starts it).
"""

import argparse
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

VIDEO = ("videotestsrc is-live=true pattern=smpte horizontal-speed=6 "
         "! video/x-raw,width={w},height={h},framerate={fps}/1 "
         "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} ! rtph264pay name=pay0 pt=96 "
         "config-interval=1")
# AAC packets outnumber the video's about 3 to 2, so a new connection's first
# packets are often audio (issue 57: the stall check once judged those stalled).
AUDIO = ("audiotestsrc is-live=true wave=sine freq=440 ! audioconvert ! audioresample "
         "! audio/x-raw,rate=16000,channels=1 ! voaacenc bitrate=32000 ! rtpmp4gpay name=pay1 pt=97")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/cam")
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--audio", action="store_true",
                        help="send AAC audio beside the video (voaacenc: gstreamer1.0-plugins-bad)")
    parser.add_argument("--user", default="", help="require this user (with --password): basic auth")
    parser.add_argument("--password", default="")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    branches = [VIDEO.format(w=width, h=height, fps=args.fps)] + ([AUDIO] if args.audio else [])
    factory.set_launch(f"( {' '.join(branches)} )")
    factory.set_shared(True)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password), token)
        server.set_auth(auth)
        permissions = GstRtspServer.RTSPPermissions()
        permissions.add_permission_for_role("user", GstRtspServer.RTSP_PERM_MEDIA_FACTORY_ACCESS, True)
        permissions.add_permission_for_role("user", GstRtspServer.RTSP_PERM_MEDIA_FACTORY_CONSTRUCT, True)
        factory.set_permissions(permissions)
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        print(f"could not listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1
    print(f"ready rtsp://127.0.0.1:{args.port}{args.path}", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
