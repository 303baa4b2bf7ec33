"""``python -m service``: run the app under uvicorn with the ``CKPT_*`` settings.

The container's CMD.  Host, port, proxy headers and the graceful-shutdown
timeout come from the same settings as everything else, so one prefix
configures the whole service.
"""

from __future__ import annotations


def main() -> None:
    import uvicorn

    from service.app import create_app
    from service.logs import uvicorn_log_config
    from service.settings import Settings

    settings = Settings()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        proxy_headers=settings.proxy_headers,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        log_config=uvicorn_log_config(settings.log_level),
        access_log=False,  # the app writes its own JSON access log
    )


# The dry-run workers' forkserver imports this module as __mp_main__: no side effects.
if __name__ == "__main__":
    main()
