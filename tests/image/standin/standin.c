/* A stand-in for the server's container in the image tier, built static so that an image
 * FROM scratch runs it (no registry, no base image needed):
 *
 *   standin exit CODE [LINE...]    print each LINE, then exit with CODE (a refused or
 *                                  crashing launch)
 *   standin serve PORT DELAY_S     print start-up lines as the launcher and vLLM do, wait
 *                                  DELAY_S seconds, then answer on 0.0.0.0:PORT like vLLM's
 *                                  OpenAI server: GET /health, GET /v1/models, and
 *                                  POST /v1/chat/completions with the known answer
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *MODELS =
    "{\"object\":\"list\",\"data\":[{\"id\":\"deepseek-v4.1-flash\",\"object\":\"model\"}]}";
static const char *COMPLETION =
    "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"42\"}}],"
    "\"usage\":{\"completion_tokens\":2}}";

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void reply(int fd, int code, const char *reason, const char *body) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     code, reason, strlen(body));
    write_all(fd, head, (size_t)n);
    write_all(fd, body, strlen(body));
}

/* Reads one request (headers, then Content-Length bytes of body) and answers it. */
static void handle(int fd) {
    char buf[16384];
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        if (len == sizeof buf - 1) return;
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r <= 0) return;
        len += (size_t)r;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t body_have = len - (size_t)(end + 4 - buf);
    const char *cl = strstr(buf, "Content-Length:");
    size_t body_want = (cl && cl < end) ? (size_t)strtoul(cl + 15, NULL, 10) : 0;
    char sink[4096];
    while (body_have < body_want) {
        ssize_t r = read(fd, sink, sizeof sink);
        if (r <= 0) return;
        body_have += (size_t)r;
    }
    if (strncmp(buf, "GET /health ", 12) == 0)
        reply(fd, 200, "OK", "{}");
    else if (strncmp(buf, "GET /v1/models ", 15) == 0)
        reply(fd, 200, "OK", MODELS);
    else if (strncmp(buf, "POST /v1/chat/completions ", 26) == 0)
        reply(fd, 200, "OK", COMPLETION);
    else
        reply(fd, 404, "Not Found", "{}");
}

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    if (argc >= 3 && strcmp(argv[1], "exit") == 0) {
        for (int i = 3; i < argc; i++) puts(argv[i]);
        return atoi(argv[2]);
    }
    if (argc != 4 || strcmp(argv[1], "serve") != 0) {
        fputs("usage: standin exit CODE [LINE...] | standin serve PORT DELAY_S\n", stderr);
        return 64;
    }
    puts("config-hash: 0123456789abcdef (node 0 of 1)");
    puts("Loading safetensors checkpoint shards:  50% Completed | 1/2");
    sleep((unsigned)atoi(argv[3]));
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(srv, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(srv, 16) != 0) {
        perror("standin: bind/listen");
        return 1;
    }
    puts("Application startup complete.");
    for (;;) {
        int fd = accept(srv, NULL, NULL);
        if (fd < 0) continue;
        handle(fd);
        close(fd);
    }
}
