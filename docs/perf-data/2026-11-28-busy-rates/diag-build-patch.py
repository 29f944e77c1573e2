p='uring/src/engine/driver/sockets.rs'
s=open(p).read()
s=s.replace("""    Some((info.tcpi_delivery_rate, flags & APP_LIMITED != 0))
}""","""    if std::env::var_os("RW_DIAG").is_some() {
        eprintln!("DIAG fd {} rate {} al {} busy {} rwnd {} sndbuf {} cwnd {} rtt {} unacked {} notsent {} acked {} t {:?}", socket.as_raw_fd(), info.tcpi_delivery_rate, flags & APP_LIMITED != 0, info.tcpi_busy_time, info.tcpi_rwnd_limited, info.tcpi_sndbuf_limited, info.tcpi_snd_cwnd, info.tcpi_rtt, info.tcpi_unacked, info.tcpi_notsent_bytes, info.tcpi_bytes_acked, std::time::Instant::now());
    }
    Some((info.tcpi_delivery_rate, flags & APP_LIMITED != 0))
}""")
open(p,'w').write(s)
